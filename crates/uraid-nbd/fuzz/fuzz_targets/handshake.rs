//! Feeds arbitrary client bytes to the handshake state machine in arbitrary pieces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uraid_nbd::codec::{BlockSizeConstraints, ExportInfo, Negotiation, NegotiationOutcome, TlsPolicy};

fuzz_target!(|data: &[u8]| {
    let Some((&split_seed, input)) = data.split_first() else { return };
    let Some((&tls_seed, input)) = input.split_first() else { return };
    let policy = [TlsPolicy::Off, TlsPolicy::On, TlsPolicy::Require][usize::from(tls_seed % 3)];
    let exports = vec![
        ExportInfo {
            name: String::new(),
            description: "default".into(),
            size_bytes: 1 << 30,
            transmission_flags: 0x0d6d,
            block_size: BlockSizeConstraints::default(),
        },
        ExportInfo {
            name: "second".into(),
            description: String::new(),
            size_bytes: 0,
            transmission_flags: 0x0103,
            block_size: BlockSizeConstraints { min_bytes: 512, preferred_bytes: 4096, max_bytes: 1 << 20 },
        },
    ];
    let mut n = Negotiation::new(exports).with_tls(policy);
    if split_seed & 0x80 != 0 {
        n.set_shutting_down();
    }
    // Deliver the input in pieces of varying size, as a socket would.
    let mut pending = Vec::new();
    let piece = usize::from(split_seed & 0x3f) + 1;
    for chunk in input.chunks(piece) {
        pending.extend_from_slice(chunk);
        match n.receive(&pending) {
            Ok(p) => {
                assert!(p.consumed_bytes <= pending.len());
                pending.drain(..p.consumed_bytes);
                match p.outcome {
                    Some(NegotiationOutcome::Transmission(s)) => {
                        assert!(s.export_index < 2);
                        assert_ne!(s.transmission_flags & 1, 0);
                        // `require`: no export is served before TLS.
                        assert!(policy != TlsPolicy::Require || n.tls_active());
                        return;
                    }
                    Some(NegotiationOutcome::StartTls) => {
                        assert!(policy != TlsPolicy::Off && !n.tls_active());
                        // The rest of the input stands for what arrives over TLS.
                        n.tls_started();
                    }
                    Some(NegotiationOutcome::Abort) => return,
                    None => {}
                }
            }
            Err(_) => return,
        }
        // Output stays bounded by what the input could ask for.
        assert!(n.output().len() <= 64 * 1024 + 64 * pending.len() + 64 * input.len());
        let _ = n.take_output();
    }
});
