//! md on-disk metadata: superblock 1.x and the internal write-intent bitmap.
