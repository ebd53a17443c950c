//! Decodes and validates arbitrary request headers against arbitrary sessions, then
//! encodes the replies the server would send.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid_nbd::codec::{
    check_request, decode_request_header, encode_error_reply, encode_read_reply_header, BlockSizeConstraints,
    Command, Decision, TransmissionContext,
};

fuzz_target!(|data: &[u8]| {
    if data.len() < 12 {
        return;
    }
    let (session, mut rest) = data.split_at(12);
    let size_bytes = u64::from_be_bytes(session[..8].try_into().unwrap());
    let transmission_flags = u16::from_be_bytes([session[8], session[9]]);
    let min_bytes = 1u32 << (session[10] % 17);
    let ctx = TransmissionContext {
        size_bytes,
        transmission_flags,
        structured_replies: session[11] & 1 != 0,
        block_size: BlockSizeConstraints {
            min_bytes,
            preferred_bytes: min_bytes.max(4096),
            max_bytes: 32 << 20,
        },
    };
    while let Some(decoded) = decode_request_header(rest) {
        rest = &rest[28..];
        let Ok(header) = decoded else { return };
        let mut out = Vec::new();
        match check_request(&header, &ctx) {
            Decision::Execute(cmd) => {
                let in_range =
                    |off: u64, len: u32| off.checked_add(u64::from(len)).is_some_and(|e| e <= size_bytes);
                match cmd {
                    Command::Read { offset_bytes, len_bytes } => {
                        assert!(in_range(offset_bytes, len_bytes) && len_bytes <= 32 << 20);
                        encode_read_reply_header(
                            &mut out,
                            ctx.structured_replies,
                            header.handle,
                            offset_bytes,
                            len_bytes,
                        );
                    }
                    Command::Write { offset_bytes, len_bytes, .. } => {
                        assert!(in_range(offset_bytes, len_bytes) && len_bytes <= 32 << 20);
                        assert_eq!(transmission_flags & 2, 0, "write on a read-only export");
                        let skip = (len_bytes as usize).min(rest.len());
                        rest = &rest[skip..];
                    }
                    Command::Trim { offset_bytes, len_bytes, .. }
                    | Command::WriteZeroes { offset_bytes, len_bytes, .. }
                    | Command::Cache { offset_bytes, len_bytes } => {
                        assert!(in_range(offset_bytes, len_bytes))
                    }
                    Command::Flush | Command::Disconnect => {}
                }
            }
            Decision::Reject { errno, message, discard_payload_bytes } => {
                assert_ne!(errno, 0);
                encode_error_reply(&mut out, ctx.structured_replies, header.handle, errno, message);
                let skip = (discard_payload_bytes as usize).min(rest.len());
                rest = &rest[skip..];
            }
        }
    }
});
