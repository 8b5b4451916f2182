//! The NBD wire format (NetworkBlockDevice's `doc/proto.md`): the fixed newstyle
//! handshake's options and replies, and the transmission phase's requests and
//! replies. Pure encoding and decoding; the server drives it.

/// "NBDMAGIC", the first bytes a server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the second, and the start of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types of NBD_OPT_INFO/GO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TX_HAS_FLAGS: u16 = 1 << 0;
pub const TX_READ_ONLY: u16 = 1 << 1;
pub const TX_SEND_FLUSH: u16 = 1 << 2;
pub const TX_SEND_FUA: u16 = 1 << 3;
pub const TX_SEND_TRIM: u16 = 1 << 5;
pub const TX_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TX_SEND_DF: u16 = 1 << 7;
pub const TX_CAN_MULTI_CONN: u16 = 1 << 8;

// Commands and their flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

// Structured reply chunks.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// Errors of the transmission phase.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The one metadata context served: which ranges hold data.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// `base:allocation` flags of a block status descriptor.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// Size of a request's header.
pub const REQUEST_BYTES: usize = 28;

/// One request of the transmission phase (its payload, for a write, follows it on the
/// wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Why bytes are not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("bad request magic {0:#x}")]
    Magic(u32),
}

impl Request {
    pub fn decode(b: &[u8; REQUEST_BYTES]) -> Result<Request, RequestError> {
        let magic = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != REQUEST_MAGIC {
            return Err(RequestError::Magic(magic));
        }
        Ok(Request {
            flags: u16::from_be_bytes([b[4], b[5]]),
            kind: u16::from_be_bytes([b[6], b[7]]),
            cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
            length: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply's header (the data of a read follows it).
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk's header (its `length` bytes of payload follow).
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, length: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// An option reply's header (`length` bytes of data follow).
pub fn option_reply(option: u32, kind: u32, length: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&kind.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// The data of `NBD_OPT_INFO`/`NBD_OPT_GO`: an export name and the information asked
/// for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// The data of `NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub name: String,
    pub queries: Vec<String>,
}

/// Why an option's data does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("option data ends early")]
    Short,
    #[error("option data has bytes after its end")]
    Trailing,
    #[error("a name is not UTF-8")]
    Utf8,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], OptionError> {
        let s = self.b.get(self.at..self.at.checked_add(n).ok_or(OptionError::Short)?).ok_or(OptionError::Short)?;
        self.at += n;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, OptionError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, OptionError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn string(&mut self) -> Result<String, OptionError> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| OptionError::Utf8)
    }
    fn end(&self) -> Result<(), OptionError> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(OptionError::Trailing)
        }
    }
}

impl InfoRequest {
    pub fn decode(b: &[u8]) -> Result<InfoRequest, OptionError> {
        let mut r = Reader { b, at: 0 };
        let name = r.string()?;
        let n = r.u16()?;
        let requests = (0..n).map(|_| r.u16()).collect::<Result<_, _>>()?;
        r.end()?;
        Ok(InfoRequest { name, requests })
    }
}

impl MetaRequest {
    pub fn decode(b: &[u8]) -> Result<MetaRequest, OptionError> {
        let mut r = Reader { b, at: 0 };
        let name = r.string()?;
        let n = r.u32()?;
        let mut queries = Vec::new();
        for _ in 0..n {
            queries.push(r.string()?);
        }
        r.end()?;
        Ok(MetaRequest { name, queries })
    }
}

/// `NBD_INFO_EXPORT`: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v
}

/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and largest payload.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    v.extend_from_slice(&min.to_be_bytes());
    v.extend_from_slice(&preferred.to_be_bytes());
    v.extend_from_slice(&max.to_be_bytes());
    v
}

/// `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`.
pub fn info_text(kind: u16, text: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 + text.len());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(text.as_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_option_data_round_trip_and_garbage_is_refused() {
        let r =
            Request { flags: CMD_FLAG_FUA, kind: CMD_WRITE, cookie: 0xdead_beef_0102, offset: 1 << 40, length: 4096 };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let mut bad = r.encode();
        bad[0] = 0;
        assert!(matches!(Request::decode(&bad), Err(RequestError::Magic(_))));
        // INFO/GO data: name "disk", two information requests.
        let mut d = Vec::new();
        d.extend_from_slice(&4u32.to_be_bytes());
        d.extend_from_slice(b"disk");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert_eq!(
            InfoRequest::decode(&d),
            Ok(InfoRequest { name: "disk".into(), requests: vec![INFO_BLOCK_SIZE, INFO_NAME] })
        );
        assert_eq!(InfoRequest::decode(&d[..d.len() - 1]), Err(OptionError::Short));
        let mut long = d.clone();
        long.push(0);
        assert_eq!(InfoRequest::decode(&long), Err(OptionError::Trailing));
        let mut huge = d.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(InfoRequest::decode(&huge), Err(OptionError::Short));
        // Meta contexts.
        let mut m = Vec::new();
        m.extend_from_slice(&0u32.to_be_bytes());
        m.extend_from_slice(&1u32.to_be_bytes());
        m.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        m.extend_from_slice(BASE_ALLOCATION.as_bytes());
        assert_eq!(
            MetaRequest::decode(&m),
            Ok(MetaRequest { name: String::new(), queries: vec![BASE_ALLOCATION.into()] })
        );
        assert_eq!(info_export(1, TX_HAS_FLAGS).len(), 12);
        assert_eq!(info_block_size(1, 4096, 1 << 25).len(), 14);
    }
}
