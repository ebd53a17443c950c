use super::*;

fn export(name: &str, size_bytes: u64) -> ExportInfo {
    ExportInfo {
        name: name.into(),
        description: "test export".into(),
        size_bytes,
        transmission_flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA,
        block_size: BlockSizeConstraints::default(),
    }
}

fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut v = (name.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

/// Splits option replies: (option, type, payload).
fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut v = Vec::new();
    while !out.is_empty() {
        assert_eq!(read_u64(out, 0), Some(OPTION_REPLY_MAGIC));
        let opt = read_u32(out, 8).unwrap();
        let ty = read_u32(out, 12).unwrap();
        let len = read_u32(out, 16).unwrap() as usize;
        v.push((opt, ty, out[20..20 + len].to_vec()));
        out = &out[20 + len..];
    }
    v
}

fn started(exports: Vec<ExportInfo>, client_flags: u32) -> Negotiation {
    let mut n = Negotiation::new(exports);
    let greeting = n.take_output();
    assert_eq!(greeting.len(), GREETING_BYTES);
    assert_eq!(read_u64(&greeting, 0), Some(NBDMAGIC));
    assert_eq!(read_u64(&greeting, 8), Some(IHAVEOPT));
    assert_eq!(read_u16(&greeting, 16), Some(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES));
    let p = n.receive(&client_flags.to_be_bytes()).unwrap();
    assert_eq!(p, Progress { consumed_bytes: 4, outcome: None });
    n
}

#[test]
fn go_replies_export_info_block_size_and_ack() {
    let mut n = started(vec![export("a", 1 << 20)], FLAG_C_FIXED_NEWSTYLE);
    let input = option(OPT_GO, &go_data("a", &[INFO_BLOCK_SIZE, INFO_NAME]));
    let p = n.receive(&input).unwrap();
    assert_eq!(p.consumed_bytes, input.len());
    let session = match p.outcome {
        Some(NegotiationOutcome::Transmission(s)) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!(session.export_index, 0);
    assert!(!session.structured_replies);
    let r = replies(&n.take_output());
    assert_eq!(r.len(), 4);
    assert_eq!(r[0].1, REP_INFO);
    assert_eq!(read_u16(&r[0].2, 0), Some(INFO_EXPORT));
    assert_eq!(read_u64(&r[0].2, 2), Some(1 << 20));
    assert_eq!(read_u16(&r[0].2, 10), Some(session.transmission_flags));
    assert_eq!(session.transmission_flags & FLAG_SEND_DF, 0);
    assert_eq!(r[1].2, [&INFO_NAME.to_be_bytes()[..], b"a"].concat());
    assert_eq!(read_u16(&r[2].2, 0), Some(INFO_BLOCK_SIZE));
    assert_eq!(read_u32(&r[2].2, 2), Some(1));
    assert_eq!(read_u32(&r[2].2, 6), Some(4096));
    assert_eq!(read_u32(&r[2].2, 10), Some(DEFAULT_MAX_PAYLOAD_BYTES));
    assert_eq!(r[3], (OPT_GO, REP_ACK, vec![]));
    // Anything after the end of negotiation is a protocol error for the codec.
    assert_eq!(n.receive(&[0]), Err(HandshakeError::AlreadyFinished));
}

#[test]
fn structured_reply_then_info_then_go_default_export() {
    let mut n = started(vec![export("first", 4096), export("second", 8192)], 3);
    let mut input = option(OPT_STRUCTURED_REPLY, &[]);
    input.extend(option(OPT_INFO, &go_data("second", &[])));
    input.extend(option(OPT_GO, &go_data("", &[])));
    // Feed byte by byte to prove partial input is handled.
    let mut buf = Vec::new();
    let mut outcome = None;
    for b in input {
        buf.push(b);
        let p = n.receive(&buf).unwrap();
        buf.drain(..p.consumed_bytes);
        if p.outcome.is_some() {
            outcome = p.outcome;
        }
    }
    assert!(buf.is_empty());
    let Some(NegotiationOutcome::Transmission(s)) = outcome else { panic!() };
    assert_eq!(s.export_index, 0);
    assert!(s.structured_replies);
    assert_ne!(s.transmission_flags & FLAG_SEND_DF, 0);
    let r = replies(&n.take_output());
    assert_eq!(r[0], (OPT_STRUCTURED_REPLY, REP_ACK, vec![]));
    assert_eq!(r[1].0, OPT_INFO);
    assert_eq!(read_u64(&r[1].2, 2), Some(8192));
    assert_eq!(r[3], (OPT_INFO, REP_ACK, vec![]));
    assert_eq!(read_u64(&r[4].2, 2), Some(4096));
    assert_eq!(r.last().unwrap(), &(OPT_GO, REP_ACK, vec![]));
}

#[test]
fn unknown_option_gets_unsup_and_negotiation_continues() {
    let mut n = started(vec![export("a", 4096)], 1);
    let mut input = option(0xdead, b"xyz");
    input.extend(option(OPT_STARTTLS, &[]));
    input.extend(option(OPT_SET_META_CONTEXT, &[0; 8]));
    input.extend(option(OPT_LIST, b"junk"));
    input.extend(option(OPT_GO, &go_data("nope", &[])));
    input.extend(option(OPT_GO, &[0, 0, 0, 9, b'a']));
    let p = n.receive(&input).unwrap();
    assert_eq!(p, Progress { consumed_bytes: input.len(), outcome: None });
    let types: Vec<_> = replies(&n.take_output()).into_iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(
        types,
        vec![
            (0xdead, REP_ERR_UNSUP),
            (OPT_STARTTLS, REP_ERR_POLICY),
            (OPT_SET_META_CONTEXT, REP_ERR_UNSUP),
            (OPT_LIST, REP_ERR_INVALID),
            (OPT_GO, REP_ERR_UNKNOWN),
            (OPT_GO, REP_ERR_INVALID),
        ]
    );
}

#[test]
fn list_and_abort() {
    let mut n = started(vec![export("a", 1), export("bb", 1)], 1);
    let mut input = option(OPT_LIST, &[]);
    input.extend(option(OPT_ABORT, &[]));
    let p = n.receive(&input).unwrap();
    assert_eq!(p.outcome, Some(NegotiationOutcome::Abort));
    let r = replies(&n.take_output());
    assert_eq!(r[0], (OPT_LIST, REP_SERVER, vec![0, 0, 0, 1, b'a']));
    assert_eq!(r[1], (OPT_LIST, REP_SERVER, vec![0, 0, 0, 2, b'b', b'b']));
    assert_eq!(r[2], (OPT_LIST, REP_ACK, vec![]));
    assert_eq!(r[3], (OPT_ABORT, REP_ACK, vec![]));
}

#[test]
fn export_name_with_and_without_zeroes() {
    for (client_flags, expect_len) in [(FLAG_C_FIXED_NEWSTYLE, 8 + 2 + 124), (3, 10)] {
        let mut n = started(vec![export("a", 12345)], client_flags);
        let p = n.receive(&option(OPT_EXPORT_NAME, b"a")).unwrap();
        assert!(matches!(p.outcome, Some(NegotiationOutcome::Transmission(_))));
        let out = n.take_output();
        assert_eq!(out.len(), expect_len);
        assert_eq!(read_u64(&out, 0), Some(12345));
    }
    let mut n = started(vec![export("a", 1)], 1);
    assert!(matches!(n.receive(&option(OPT_EXPORT_NAME, b"zz")), Err(HandshakeError::UnknownExport { .. })));
}

#[test]
fn hostile_handshakes_close() {
    let mut n = Negotiation::new(vec![export("a", 1)]);
    assert_eq!(n.receive(&[0, 0, 0, 4]), Err(HandshakeError::UnknownClientFlags { flags: 4 }));
    let mut n = started(vec![export("a", 1)], 1);
    let mut bad = option(OPT_LIST, &[]);
    bad[0] ^= 1;
    assert!(matches!(n.receive(&bad), Err(HandshakeError::BadMagic { .. })));
    let mut n = started(vec![export("a", 1)], 1);
    let mut huge = IHAVEOPT.to_be_bytes().to_vec();
    huge.extend_from_slice(&OPT_GO.to_be_bytes());
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(n.receive(&huge), Err(HandshakeError::OptionTooLarge { .. })));
}

#[test]
fn shutting_down_errors_options_but_acks_abort() {
    let mut n = started(vec![export("a", 1)], 1);
    n.set_shutting_down();
    let mut input = option(OPT_GO, &go_data("a", &[]));
    input.extend(option(OPT_ABORT, &[]));
    let p = n.receive(&input).unwrap();
    assert_eq!(p.outcome, Some(NegotiationOutcome::Abort));
    let r = replies(&n.take_output());
    assert_eq!((r[0].0, r[0].1), (OPT_GO, REP_ERR_SHUTDOWN));
    assert_eq!(r[1], (OPT_ABORT, REP_ACK, vec![]));
}

#[test]
fn tls_off_refuses_starttls_by_policy_and_never_asks_for_tls() {
    let mut n = started(vec![export("a", 1)], 1);
    let mut input = option(OPT_STARTTLS, &[]);
    input.extend(option(OPT_LIST, &[]));
    let p = n.receive(&input).unwrap();
    assert_eq!(p.outcome, None);
    let r = replies(&n.take_output());
    assert_eq!((r[0].0, r[0].1), (OPT_STARTTLS, REP_ERR_POLICY));
    assert_eq!((r[1].0, r[1].1), (OPT_LIST, REP_SERVER));
}

#[test]
fn tls_require_refuses_everything_but_starttls_and_abort_before_tls() {
    let mut n = started(vec![export("secret", 1)], 1).with_tls(TlsPolicy::Require);
    let mut input = option(OPT_LIST, &[]);
    input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    input.extend(option(OPT_INFO, &go_data("secret", &[])));
    input.extend(option(OPT_GO, &go_data("secret", &[])));
    let p = n.receive(&input).unwrap();
    assert_eq!(p, Progress { consumed_bytes: input.len(), outcome: None });
    let out = n.take_output();
    // Nothing about the exports is told in plaintext: not even their names.
    assert!(!out.windows(6).any(|w| w == b"secret"));
    let types: Vec<_> = replies(&out).into_iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(
        types,
        vec![
            (OPT_LIST, REP_ERR_TLS_REQD),
            (OPT_STRUCTURED_REPLY, REP_ERR_TLS_REQD),
            (OPT_INFO, REP_ERR_TLS_REQD),
            (OPT_GO, REP_ERR_TLS_REQD),
        ]
    );
    // EXPORT_NAME cannot carry an error: the server closes.
    assert_eq!(n.receive(&option(OPT_EXPORT_NAME, b"secret")), Err(HandshakeError::TlsRequired));
    // ABORT is still acknowledged.
    let mut n = started(vec![export("a", 1)], 1).with_tls(TlsPolicy::Require);
    assert_eq!(n.receive(&option(OPT_ABORT, &[])).unwrap().outcome, Some(NegotiationOutcome::Abort));
}

#[test]
fn starttls_then_negotiation_restarts_over_tls() {
    for policy in [TlsPolicy::On, TlsPolicy::Require] {
        let mut n = started(vec![export("a", 4096)], 1).with_tls(policy);
        // Structured replies agreed in plaintext (allowed under `on`) are forgotten.
        let mut input = option(OPT_STRUCTURED_REPLY, &[]);
        input.extend(option(OPT_STARTTLS, b"x"));
        input.extend(option(OPT_STARTTLS, &[]));
        input.extend(option(OPT_LIST, &[]));
        let p = n.receive(&input).unwrap();
        assert_eq!(p.outcome, Some(NegotiationOutcome::StartTls));
        // The codec stops right after the ACK: what follows belongs to the TLS session.
        assert_eq!(p.consumed_bytes, input.len() - OPTION_HEADER_BYTES);
        let r = replies(&n.take_output());
        let expect_sr = if policy == TlsPolicy::On { REP_ACK } else { REP_ERR_TLS_REQD };
        assert_eq!((r[0].0, r[0].1), (OPT_STRUCTURED_REPLY, expect_sr));
        assert_eq!((r[1].0, r[1].1), (OPT_STARTTLS, REP_ERR_INVALID));
        assert_eq!(r[2], (OPT_STARTTLS, REP_ACK, vec![]));
        assert!(!n.tls_active());
        n.tls_started();
        assert!(n.tls_active());
        let mut input = option(OPT_STARTTLS, &[]);
        input.extend(option(OPT_LIST, &[]));
        input.extend(option(OPT_GO, &go_data("a", &[])));
        let p = n.receive(&input).unwrap();
        let Some(NegotiationOutcome::Transmission(s)) = p.outcome else { panic!("{p:?}") };
        assert!(!s.structured_replies, "plaintext negotiation must not carry over into TLS");
        let r = replies(&n.take_output());
        assert_eq!((r[0].0, r[0].1), (OPT_STARTTLS, REP_ERR_INVALID));
        assert_eq!(r[1], (OPT_LIST, REP_SERVER, vec![0, 0, 0, 1, b'a']));
        assert!(r.iter().all(|x| x.1 != REP_ERR_TLS_REQD));
    }
}

fn ctx(flags: u16) -> TransmissionContext {
    TransmissionContext {
        size_bytes: 1 << 20,
        transmission_flags: FLAG_HAS_FLAGS | flags,
        structured_replies: false,
        block_size: BlockSizeConstraints::default(),
    }
}

fn hdr(command: u16, flags: u16, offset_bytes: u64, len_bytes: u32) -> RequestHeader {
    RequestHeader { flags, command, handle: 7, offset_bytes, len_bytes }
}

#[test]
fn request_header_round_trip_and_bad_magic() {
    let h = hdr(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
    let mut buf = Vec::new();
    encode_request_header(&mut buf, &h);
    assert_eq!(buf.len(), REQUEST_HEADER_BYTES);
    assert_eq!(decode_request_header(&buf[..27]), None);
    assert_eq!(decode_request_header(&buf), Some(Ok(h)));
    buf[3] ^= 0xff;
    assert!(matches!(decode_request_header(&buf), Some(Err(BadRequestMagic { .. }))));
}

#[test]
fn validation_errors() {
    let c = ctx(FLAG_SEND_FAST_ZERO);
    let rej = |d: Decision| match d {
        Decision::Reject { errno, discard_payload_bytes, .. } => (errno, discard_payload_bytes),
        other => panic!("{other:?}"),
    };
    assert_eq!(rej(check_request(&hdr(99, 0, 0, 10), &c)), (EINVAL, 0));
    assert_eq!(rej(check_request(&hdr(CMD_READ, CMD_FLAG_NO_HOLE, 0, 10), &c)), (EINVAL, 0));
    // DF needs structured replies.
    assert_eq!(rej(check_request(&hdr(CMD_READ, CMD_FLAG_DF, 0, 10), &c)), (EINVAL, 0));
    assert_eq!(rej(check_request(&hdr(CMD_WRITE, 0x8000, 0, 10), &c)), (EINVAL, 10));
    assert_eq!(rej(check_request(&hdr(CMD_READ, 0, (1 << 20) - 1, 2), &c)), (EINVAL, 0));
    assert_eq!(rej(check_request(&hdr(CMD_WRITE, 0, (1 << 20) - 1, 2), &c)), (ENOSPC, 2));
    assert_eq!(rej(check_request(&hdr(CMD_WRITE_ZEROES, 0, u64::MAX, 2), &c)), (ENOSPC, 0));
    assert_eq!(rej(check_request(&hdr(CMD_TRIM, 0, u64::MAX, 2), &c)), (EINVAL, 0));
    let too_big = DEFAULT_MAX_PAYLOAD_BYTES + 1;
    assert_eq!(rej(check_request(&hdr(CMD_WRITE, 0, 0, too_big), &c)), (EINVAL, too_big));
    assert_eq!(rej(check_request(&hdr(CMD_READ, 0, 0, too_big), &c)), (EINVAL, 0));
    let ro = ctx(FLAG_READ_ONLY);
    assert_eq!(rej(check_request(&hdr(CMD_WRITE, 0, 0, 5), &ro)), (EPERM, 5));
    assert_eq!(rej(check_request(&hdr(CMD_TRIM, 0, 0, 5), &ro)), (EPERM, 0));
    assert_eq!(rej(check_request(&hdr(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 5), &ctx(0))), (EINVAL, 0));
    let mut aligned = ctx(0);
    aligned.block_size.min_bytes = 512;
    assert_eq!(rej(check_request(&hdr(CMD_READ, 0, 512, 100), &aligned)), (EINVAL, 0));
    assert_eq!(
        check_request(&hdr(CMD_READ, 0, 512, 1024), &aligned),
        Decision::Execute(Command::Read { offset_bytes: 512, len_bytes: 1024 })
    );
}

#[test]
fn validation_accepts() {
    let mut c = ctx(FLAG_SEND_FAST_ZERO);
    c.structured_replies = true;
    assert_eq!(
        check_request(&hdr(CMD_READ, CMD_FLAG_DF | CMD_FLAG_FUA, (1 << 20) - 10, 10), &c),
        Decision::Execute(Command::Read { offset_bytes: (1 << 20) - 10, len_bytes: 10 })
    );
    assert_eq!(
        check_request(&hdr(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO, 0, 4096), &c),
        Decision::Execute(Command::WriteZeroes {
            offset_bytes: 0,
            len_bytes: 4096,
            fua: false,
            no_hole: true,
            fast_only: true
        })
    );
    assert_eq!(check_request(&hdr(CMD_FLUSH, 0, 5, 5), &c), Decision::Execute(Command::Flush));
    assert_eq!(check_request(&hdr(CMD_DISC, 0, 0, 0), &c), Decision::Execute(Command::Disconnect));
    assert_eq!(
        check_request(&hdr(CMD_CACHE, 0, 0, 1), &c),
        Decision::Execute(Command::Cache { offset_bytes: 0, len_bytes: 1 })
    );
}

#[test]
fn reply_encodings() {
    let mut out = Vec::new();
    encode_read_reply_header(&mut out, false, 9, 0, 100);
    assert_eq!(out, [&SIMPLE_REPLY_MAGIC.to_be_bytes()[..], &[0; 4], &9u64.to_be_bytes()].concat());
    out.clear();
    encode_read_reply_header(&mut out, true, 9, 4096, 100);
    assert_eq!(out.len(), STRUCTURED_REPLY_HEADER_BYTES + 8);
    assert_eq!(read_u16(&out, 4), Some(REPLY_FLAG_DONE));
    assert_eq!(read_u16(&out, 6), Some(REPLY_TYPE_OFFSET_DATA));
    assert_eq!(read_u32(&out, 16), Some(108));
    assert_eq!(read_u64(&out, 20), Some(4096));
    out.clear();
    encode_error_reply(&mut out, true, 9, ENOSPC, "full");
    assert_eq!(read_u16(&out, 6), Some(REPLY_TYPE_ERROR));
    assert_eq!(read_u32(&out, 16), Some(10));
    assert_eq!(read_u32(&out, 20), Some(ENOSPC));
    assert_eq!(&out[26..], b"full");
    out.clear();
    encode_error_reply(&mut out, false, 9, 0, "x");
    assert_eq!(read_u32(&out, 4), Some(EIO));
}

#[test]
fn block_size_validity() {
    assert!(BlockSizeConstraints::default().is_valid());
    assert!(!BlockSizeConstraints { min_bytes: 3, ..Default::default() }.is_valid());
    assert!(!BlockSizeConstraints { max_bytes: 100, ..Default::default() }.is_valid());
}
