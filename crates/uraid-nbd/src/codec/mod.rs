//! Sans-IO NBD codec: the fixed-newstyle handshake as a state machine, request-header
//! decoding and validation, and reply encoding.
//!
//! Nothing here touches a socket. The caller feeds received bytes in, writes out the
//! bytes the codec queues, and acts on the decisions it returns. That keeps every
//! parser of outside bytes fuzzable and unit-testable on plain byte slices.

use crate::proto::*;

/// Block-size constraints advertised in `NBD_INFO_BLOCK_SIZE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizeConstraints {
    /// Smallest addressable unit: 1 (byte granular) or a power of two up to 64 KiB.
    pub min_bytes: u32,
    /// The size below which the device does read-modify-write.
    pub preferred_bytes: u32,
    /// Largest READ/WRITE payload accepted.
    pub max_bytes: u32,
}

impl Default for BlockSizeConstraints {
    fn default() -> Self {
        BlockSizeConstraints { min_bytes: 1, preferred_bytes: 4096, max_bytes: DEFAULT_MAX_PAYLOAD_BYTES }
    }
}

impl BlockSizeConstraints {
    /// proto.md: min a power of two in 1..=64 KiB, preferred a power of two >= min (and
    /// >= 512), max a multiple of min and >= preferred... we require the sane subset.
    pub fn is_valid(&self) -> bool {
        let pow2 = |v: u32| v != 0 && v.is_power_of_two();
        pow2(self.min_bytes)
            && self.min_bytes <= 64 * 1024
            && pow2(self.preferred_bytes)
            && self.preferred_bytes >= self.min_bytes
            && self.max_bytes >= self.preferred_bytes
            && self.max_bytes % self.min_bytes == 0
    }
}

/// What the handshake needs to know about one export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    /// Transmission flags as they hold with simple replies; `NBD_FLAG_SEND_DF` is added by
    /// the codec when structured replies are negotiated.
    pub transmission_flags: u16,
    pub block_size: BlockSizeConstraints,
}

/// A hard-disconnect reason during the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    BadMagic {
        found: u64,
    },
    UnknownClientFlags {
        flags: u32,
    },
    /// Option data larger than we are willing to buffer: a denial-of-service guard.
    OptionTooLarge {
        option: u32,
        len_bytes: u32,
    },
    /// `NBD_OPT_EXPORT_NAME` cannot return an error, so an unknown name closes.
    UnknownExport {
        name: Vec<u8>,
    },
    /// The client sent more options after the negotiation finished.
    AlreadyFinished,
    /// `NBD_OPT_EXPORT_NAME` before TLS under [`TlsPolicy::Require`]: it cannot carry an
    /// error, so proto.md (FORCEDTLS) has the server close.
    TlsRequired,
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::BadMagic { found } => write!(f, "bad option magic {found:#018x}"),
            HandshakeError::UnknownClientFlags { flags } => write!(f, "unknown client flags {flags:#x}"),
            HandshakeError::OptionTooLarge { option, len_bytes } => {
                write!(f, "option {option} carries {len_bytes} bytes, more than allowed")
            }
            HandshakeError::UnknownExport { name } => {
                write!(f, "unknown export {:?}", String::from_utf8_lossy(name))
            }
            HandshakeError::AlreadyFinished => f.write_str("negotiation already finished"),
            HandshakeError::TlsRequired => f.write_str("NBD_OPT_EXPORT_NAME before TLS, which is required"),
        }
    }
}
impl std::error::Error for HandshakeError {}

/// The parameters the transmission phase runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub export_index: usize,
    pub structured_replies: bool,
    /// The flags actually sent to the client.
    pub transmission_flags: u16,
    /// The export size the client was told: it holds for the whole connection.
    pub size_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NegotiationOutcome {
    /// Enter transmission; all queued output must be sent first.
    Transmission(Session),
    /// The client aborted (`NBD_OPT_ABORT`); send queued output and close.
    Abort,
    /// `NBD_OPT_STARTTLS` was acknowledged: send the queued output (the ACK) in plaintext,
    /// run the TLS handshake, call [`Negotiation::tls_started`], and go on feeding what
    /// arrives over TLS. A failed TLS handshake closes the connection.
    StartTls,
}

/// Whether the server offers TLS, as nbdkit's `--tls off|on|require` (proto.md's NOTLS,
/// SELECTIVETLS with no TLS-only export, FORCEDTLS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsPolicy {
    /// `NBD_OPT_STARTTLS` is refused with `NBD_REP_ERR_POLICY`.
    #[default]
    Off,
    /// A client may start TLS or stay in plaintext.
    On,
    /// Every option but STARTTLS and ABORT gets `NBD_REP_ERR_TLS_REQD` until TLS runs, so
    /// nothing (not even the export list) is told in plaintext.
    Require,
}

/// Progress report of [`Negotiation::receive`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub consumed_bytes: usize,
    pub outcome: Option<NegotiationOutcome>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HandshakeState {
    ClientFlags,
    Options,
    Finished,
}

/// Option data we buffer at most: a GO naming a 4096-byte export and asking for a few
/// hundred info types fits easily; anything bigger is hostile.
pub const MAX_OPTION_DATA_BYTES: u32 = 16 * 1024;

/// Server side of the fixed-newstyle handshake.
///
/// Usage: send [`Negotiation::take_output`] (the greeting) right away; then repeatedly
/// append received bytes to a buffer, call [`Negotiation::receive`] on it, drop the
/// consumed prefix, send the new output, until an outcome or an error appears.
pub struct Negotiation {
    exports: Vec<ExportInfo>,
    state: HandshakeState,
    no_zeroes: bool,
    structured_replies: bool,
    shutting_down: bool,
    tls: TlsPolicy,
    tls_active: bool,
    output: Vec<u8>,
}

impl Negotiation {
    /// `exports[0]` is also the default export, chosen by the empty name.
    pub fn new(exports: Vec<ExportInfo>) -> Self {
        let mut output = Vec::with_capacity(GREETING_BYTES);
        output.extend_from_slice(&NBDMAGIC.to_be_bytes());
        output.extend_from_slice(&IHAVEOPT.to_be_bytes());
        output.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        Negotiation {
            exports,
            state: HandshakeState::ClientFlags,
            no_zeroes: false,
            structured_replies: false,
            shutting_down: false,
            tls: TlsPolicy::Off,
            tls_active: false,
            output,
        }
    }

    /// Offers (or requires) TLS through `NBD_OPT_STARTTLS`; the caller must be able to run
    /// a TLS session when [`NegotiationOutcome::StartTls`] comes back.
    pub fn with_tls(mut self, policy: TlsPolicy) -> Self {
        self.tls = policy;
        self
    }

    /// The TLS handshake after [`NegotiationOutcome::StartTls`] succeeded. What was agreed in
    /// plaintext is forgotten (as nbdkit and qemu do): a man in the middle could have
    /// chosen it, so the client negotiates again over TLS.
    pub fn tls_started(&mut self) {
        self.tls_active = true;
        self.structured_replies = false;
    }

    /// Whether the negotiation now runs over TLS.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// From now on, answer every option but ABORT with `NBD_REP_ERR_SHUTDOWN`.
    pub fn set_shutting_down(&mut self) {
        self.shutting_down = true;
    }

    /// Bytes queued for the client.
    pub fn output(&self) -> &[u8] {
        &self.output
    }

    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Consumes as many complete client messages from `input` as there are, stopping at
    /// an outcome. On error, whatever output is queued may still be sent before closing.
    pub fn receive(&mut self, input: &[u8]) -> Result<Progress, HandshakeError> {
        let mut consumed_bytes = 0;
        loop {
            let rest = &input[consumed_bytes..];
            match self.state {
                HandshakeState::Finished => {
                    if rest.is_empty() {
                        return Ok(Progress { consumed_bytes, outcome: None });
                    }
                    return Err(HandshakeError::AlreadyFinished);
                }
                HandshakeState::ClientFlags => {
                    let Some(flags) = read_u32(rest, 0) else {
                        return Ok(Progress { consumed_bytes, outcome: None });
                    };
                    consumed_bytes += 4;
                    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        return Err(HandshakeError::UnknownClientFlags { flags });
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.state = HandshakeState::Options;
                }
                HandshakeState::Options => {
                    if rest.len() < OPTION_HEADER_BYTES {
                        return Ok(Progress { consumed_bytes, outcome: None });
                    }
                    let magic = read_u64(rest, 0).unwrap_or(0);
                    if magic != IHAVEOPT {
                        return Err(HandshakeError::BadMagic { found: magic });
                    }
                    let option = read_u32(rest, 8).unwrap_or(0);
                    let len_bytes = read_u32(rest, 12).unwrap_or(0);
                    if len_bytes > MAX_OPTION_DATA_BYTES {
                        return Err(HandshakeError::OptionTooLarge { option, len_bytes });
                    }
                    let total = OPTION_HEADER_BYTES + len_bytes as usize;
                    if rest.len() < total {
                        return Ok(Progress { consumed_bytes, outcome: None });
                    }
                    let data = &rest[OPTION_HEADER_BYTES..total];
                    consumed_bytes += total;
                    if let Some(outcome) = self.handle_option(option, data)? {
                        if outcome != NegotiationOutcome::StartTls {
                            self.state = HandshakeState::Finished;
                        }
                        return Ok(Progress { consumed_bytes, outcome: Some(outcome) });
                    }
                }
            }
        }
    }

    fn find_export(&self, name: &[u8]) -> Option<usize> {
        if name.is_empty() && !self.exports.is_empty() {
            return Some(0);
        }
        self.exports.iter().position(|e| e.name.as_bytes() == name)
    }

    fn session_flags(&self, export_index: usize) -> u16 {
        let mut flags = self.exports[export_index].transmission_flags | FLAG_HAS_FLAGS;
        // Every read is answered with one content chunk, so "don't fragment" always holds;
        // the flag may only be set once structured replies exist.
        if self.structured_replies {
            flags |= FLAG_SEND_DF;
        } else {
            flags &= !FLAG_SEND_DF;
        }
        flags
    }

    fn handle_option(
        &mut self,
        option: u32,
        data: &[u8],
    ) -> Result<Option<NegotiationOutcome>, HandshakeError> {
        if option == OPT_ABORT {
            self.option_reply(option, REP_ACK, &[]);
            return Ok(Some(NegotiationOutcome::Abort));
        }
        if self.shutting_down {
            if option == OPT_EXPORT_NAME {
                // EXPORT_NAME cannot carry an error; closing is the only answer.
                return Err(HandshakeError::UnknownExport { name: data.to_vec() });
            }
            self.option_error(option, REP_ERR_SHUTDOWN, "server is shutting down");
            return Ok(None);
        }
        if option == OPT_STARTTLS {
            return Ok(self.handle_starttls(data));
        }
        if self.tls == TlsPolicy::Require && !self.tls_active {
            if option == OPT_EXPORT_NAME {
                return Err(HandshakeError::TlsRequired);
            }
            self.option_error(
                option,
                REP_ERR_TLS_REQD,
                "this server requires TLS: connect with TLS credentials (an nbds:// URI, tls-creds)",
            );
            return Ok(None);
        }
        match option {
            OPT_EXPORT_NAME => {
                let Some(index) = self.find_export(data) else {
                    return Err(HandshakeError::UnknownExport { name: data.to_vec() });
                };
                let flags = self.session_flags(index);
                self.output.extend_from_slice(&self.exports[index].size_bytes.to_be_bytes());
                self.output.extend_from_slice(&flags.to_be_bytes());
                if !self.no_zeroes {
                    self.output.extend_from_slice(&[0u8; 124]);
                }
                Ok(Some(NegotiationOutcome::Transmission(Session {
                    export_index: index,
                    structured_replies: self.structured_replies,
                    transmission_flags: flags,
                    size_bytes: self.exports[index].size_bytes,
                })))
            }
            OPT_LIST => {
                if !data.is_empty() {
                    self.option_error(option, REP_ERR_INVALID, "NBD_OPT_LIST carries no data");
                    return Ok(None);
                }
                for i in 0..self.exports.len() {
                    let name = self.exports[i].name.clone();
                    let mut payload = Vec::with_capacity(4 + name.len());
                    payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    payload.extend_from_slice(name.as_bytes());
                    self.option_reply(option, REP_SERVER, &payload);
                }
                self.option_reply(option, REP_ACK, &[]);
                Ok(None)
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.option_error(option, REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY carries no data");
                    return Ok(None);
                }
                self.structured_replies = true;
                self.option_reply(option, REP_ACK, &[]);
                Ok(None)
            }
            OPT_INFO | OPT_GO => self.handle_info_or_go(option, data),
            _ => {
                self.option_error(option, REP_ERR_UNSUP, "option not supported");
                Ok(None)
            }
        }
    }

    fn handle_starttls(&mut self, data: &[u8]) -> Option<NegotiationOutcome> {
        let refusal = if self.tls == TlsPolicy::Off {
            Some((REP_ERR_POLICY, "TLS is not enabled on this server"))
        } else if self.tls_active {
            Some((REP_ERR_INVALID, "TLS is already running"))
        } else if !data.is_empty() {
            Some((REP_ERR_INVALID, "NBD_OPT_STARTTLS carries no data"))
        } else {
            None
        };
        if let Some((reply, message)) = refusal {
            self.option_error(OPT_STARTTLS, reply, message);
            return None;
        }
        self.option_reply(OPT_STARTTLS, REP_ACK, &[]);
        Some(NegotiationOutcome::StartTls)
    }

    fn handle_info_or_go(
        &mut self,
        option: u32,
        data: &[u8],
    ) -> Result<Option<NegotiationOutcome>, HandshakeError> {
        let Some(request) = parse_info_request(data) else {
            self.option_error(option, REP_ERR_INVALID, "malformed NBD_OPT_INFO/NBD_OPT_GO data");
            return Ok(None);
        };
        let Some(index) = self.find_export(request.name) else {
            self.option_error(option, REP_ERR_UNKNOWN, "no such export");
            return Ok(None);
        };
        let flags = self.session_flags(index);
        let export = self.exports[index].clone();

        let mut info = Vec::with_capacity(12);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&export.size_bytes.to_be_bytes());
        info.extend_from_slice(&flags.to_be_bytes());
        self.option_reply(option, REP_INFO, &info);

        if request.wants(INFO_NAME) {
            let mut info = INFO_NAME.to_be_bytes().to_vec();
            info.extend_from_slice(export.name.as_bytes());
            self.option_reply(option, REP_INFO, &info);
        }
        if request.wants(INFO_DESCRIPTION) && !export.description.is_empty() {
            let mut info = INFO_DESCRIPTION.to_be_bytes().to_vec();
            let desc = truncate_utf8(&export.description, MAX_STRING_BYTES);
            info.extend_from_slice(desc.as_bytes());
            self.option_reply(option, REP_INFO, &info);
        }
        // Sent unrequested too: proto.md lets the server volunteer it, and a client that
        // does not understand it ignores it.
        let mut info = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        info.extend_from_slice(&export.block_size.min_bytes.to_be_bytes());
        info.extend_from_slice(&export.block_size.preferred_bytes.to_be_bytes());
        info.extend_from_slice(&export.block_size.max_bytes.to_be_bytes());
        self.option_reply(option, REP_INFO, &info);

        self.option_reply(option, REP_ACK, &[]);
        if option == OPT_GO {
            Ok(Some(NegotiationOutcome::Transmission(Session {
                export_index: index,
                structured_replies: self.structured_replies,
                transmission_flags: flags,
                size_bytes: self.exports[index].size_bytes,
            })))
        } else {
            Ok(None)
        }
    }

    fn option_reply(&mut self, option: u32, reply_type: u32, payload: &[u8]) {
        self.output.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        self.output.extend_from_slice(&option.to_be_bytes());
        self.output.extend_from_slice(&reply_type.to_be_bytes());
        self.output.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        self.output.extend_from_slice(payload);
    }

    fn option_error(&mut self, option: u32, reply_type: u32, message: &str) {
        self.option_reply(option, reply_type, message.as_bytes());
    }
}

struct InfoRequest<'a> {
    name: &'a [u8],
    info_types: &'a [u8],
}

impl InfoRequest<'_> {
    fn wants(&self, info_type: u16) -> bool {
        self.info_types.chunks_exact(2).any(|c| u16::from_be_bytes([c[0], c[1]]) == info_type)
    }
}

/// Data of INFO/GO: u32 name length, name, u16 count, count x u16 info types; the sizes
/// must account for every byte.
fn parse_info_request(data: &[u8]) -> Option<InfoRequest<'_>> {
    let name_len = read_u32(data, 0)? as usize;
    if name_len > MAX_STRING_BYTES {
        return None;
    }
    let name = data.get(4..4 + name_len)?;
    let count = read_u16(data, 4 + name_len)? as usize;
    let start = 4 + name_len + 2;
    if data.len() != start + 2 * count {
        return None;
    }
    Some(InfoRequest { name, info_types: &data[start..] })
}

fn truncate_utf8(s: &str, max_bytes: usize) -> &str {
    if s.len() <= max_bytes {
        return s;
    }
    let mut end = max_bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}
fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}
fn read_u64(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

// ---------------------------------------------------------------------------------------
// Transmission phase
// ---------------------------------------------------------------------------------------

/// A request header as it arrived, unvalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset_bytes: u64,
    pub len_bytes: u32,
}

/// The request magic was wrong: framing is lost, so the connection must close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadRequestMagic {
    pub found: u32,
}

impl std::fmt::Display for BadRequestMagic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad request magic {:#010x}", self.found)
    }
}
impl std::error::Error for BadRequestMagic {}

/// Decodes a 28-byte request header; `None` when `buf` holds fewer bytes.
pub fn decode_request_header(buf: &[u8]) -> Option<Result<RequestHeader, BadRequestMagic>> {
    if buf.len() < REQUEST_HEADER_BYTES {
        return None;
    }
    let magic = read_u32(buf, 0)?;
    if magic != REQUEST_MAGIC {
        return Some(Err(BadRequestMagic { found: magic }));
    }
    Some(Ok(RequestHeader {
        flags: read_u16(buf, 4)?,
        command: read_u16(buf, 6)?,
        handle: read_u64(buf, 8)?,
        offset_bytes: read_u64(buf, 16)?,
        len_bytes: read_u32(buf, 24)?,
    }))
}

/// Encodes a request header (used by tests and test clients).
pub fn encode_request_header(out: &mut Vec<u8>, header: &RequestHeader) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&header.flags.to_be_bytes());
    out.extend_from_slice(&header.command.to_be_bytes());
    out.extend_from_slice(&header.handle.to_be_bytes());
    out.extend_from_slice(&header.offset_bytes.to_be_bytes());
    out.extend_from_slice(&header.len_bytes.to_be_bytes());
}

/// What the transmission validator needs to know about the negotiated session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransmissionContext {
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub structured_replies: bool,
    pub block_size: BlockSizeConstraints,
}

impl TransmissionContext {
    fn read_only(&self) -> bool {
        self.transmission_flags & FLAG_READ_ONLY != 0
    }
}

/// A validated command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset_bytes: u64,
        len_bytes: u32,
    },
    /// The caller must read `len_bytes` of payload after the header.
    Write {
        offset_bytes: u64,
        len_bytes: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset_bytes: u64,
        len_bytes: u32,
        fua: bool,
    },
    WriteZeroes {
        offset_bytes: u64,
        len_bytes: u32,
        fua: bool,
        no_hole: bool,
        fast_only: bool,
    },
    Cache {
        offset_bytes: u64,
        len_bytes: u32,
    },
    /// Soft disconnect: finish in-flight requests, then close.
    Disconnect,
}

/// The validator's verdict on a request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Execute(Command),
    /// Reply with this error. Before reading the next header the caller must skip
    /// `discard_payload_bytes` of write payload so framing is kept.
    Reject {
        errno: u32,
        message: &'static str,
        discard_payload_bytes: u32,
    },
}

/// Validates a request against the session. Never panics, whatever the header holds.
pub fn check_request(header: &RequestHeader, ctx: &TransmissionContext) -> Decision {
    let payload = if header.command == CMD_WRITE { header.len_bytes } else { 0 };
    let reject = |errno, message| Decision::Reject { errno, message, discard_payload_bytes: payload };
    let fast_zero = ctx.transmission_flags & FLAG_SEND_FAST_ZERO != 0;
    // FUA is accepted on every command: proto.md notes clients set it on reads too, and
    // ignoring it where nothing is written is allowed.
    let allowed_flags = match header.command {
        CMD_READ if ctx.structured_replies => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_CACHE => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES if fast_zero => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_DISC => u16::MAX,
        _ => return reject(EINVAL, "unknown command"),
    };
    if header.flags & !allowed_flags != 0 {
        return reject(EINVAL, "command flag not valid for this command");
    }
    let fua = header.flags & CMD_FLAG_FUA != 0;
    let offset_bytes = header.offset_bytes;
    let len_bytes = header.len_bytes;
    match header.command {
        CMD_DISC => return Decision::Execute(Command::Disconnect),
        // Offset and length of a flush are reserved; ignoring nonzero values is harmless.
        CMD_FLUSH => return Decision::Execute(Command::Flush),
        _ => {}
    }
    let writes = matches!(header.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && ctx.read_only() {
        return reject(EPERM, "export is read-only");
    }
    if matches!(header.command, CMD_READ | CMD_WRITE) && len_bytes > ctx.block_size.max_bytes {
        return reject(EINVAL, "request larger than the maximum block size");
    }
    let end_ok = offset_bytes.checked_add(u64::from(len_bytes)).is_some_and(|end| end <= ctx.size_bytes);
    if !end_ok {
        return if matches!(header.command, CMD_WRITE | CMD_WRITE_ZEROES) {
            reject(ENOSPC, "request beyond the end of the export")
        } else {
            reject(EINVAL, "request beyond the end of the export")
        };
    }
    let min = u64::from(ctx.block_size.min_bytes.max(1));
    if min > 1 && (offset_bytes % min != 0 || u64::from(len_bytes) % min != 0) {
        return reject(EINVAL, "request not aligned to the minimum block size");
    }
    Decision::Execute(match header.command {
        CMD_READ => Command::Read { offset_bytes, len_bytes },
        CMD_WRITE => Command::Write { offset_bytes, len_bytes, fua },
        CMD_TRIM => Command::Trim { offset_bytes, len_bytes, fua },
        CMD_CACHE => Command::Cache { offset_bytes, len_bytes },
        _ => Command::WriteZeroes {
            offset_bytes,
            len_bytes,
            fua,
            no_hole: header.flags & CMD_FLAG_NO_HOLE != 0,
            fast_only: header.flags & CMD_FLAG_FAST_ZERO != 0,
        },
    })
}

/// Appends a simple reply header (no payload).
pub fn encode_simple_reply(out: &mut Vec<u8>, handle: u64, errno: u32) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
}

fn encode_chunk_header(out: &mut Vec<u8>, flags: u16, chunk_type: u16, handle: u64, len_bytes: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&chunk_type.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&len_bytes.to_be_bytes());
}

/// Appends the header of a successful read reply; the caller sends `data_len_bytes` of
/// data right after it. With structured replies this is one final OFFSET_DATA chunk (or a
/// NONE chunk for an empty read, since a data chunk must describe at least one byte).
pub fn encode_read_reply_header(
    out: &mut Vec<u8>,
    structured: bool,
    handle: u64,
    offset_bytes: u64,
    data_len_bytes: u32,
) {
    if !structured {
        encode_simple_reply(out, handle, 0);
    } else if data_len_bytes == 0 {
        encode_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0);
    } else {
        // Max block size is below 4 GiB - 8, so the chunk length cannot overflow.
        let len = data_len_bytes.saturating_add(8);
        encode_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, handle, len);
        out.extend_from_slice(&offset_bytes.to_be_bytes());
    }
}

/// Appends a success reply for a command without reply payload.
pub fn encode_ok_reply(out: &mut Vec<u8>, structured: bool, handle: u64) {
    // Simple replies are allowed for payload-less success even in structured mode, and
    // cost 4 bytes less.
    let _ = structured;
    encode_simple_reply(out, handle, 0);
}

/// Appends an error reply. Structured mode carries the message for humans; a read in
/// structured mode must not get a simple reply.
pub fn encode_error_reply(out: &mut Vec<u8>, structured: bool, handle: u64, errno: u32, message: &str) {
    let errno = if errno == 0 { EIO } else { errno };
    if !structured {
        encode_simple_reply(out, handle, errno);
        return;
    }
    let message = truncate_utf8(message, MAX_STRING_BYTES);
    encode_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, 6 + message.len() as u32);
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
}

#[cfg(test)]
mod tests;
