//! Connection authentication with the cluster secret.
//!
//! Mutual challenge/response; the secret never crosses the wire:
//!
//! 1. client → server `Hello { client_nonce, client_id }`
//! 2. server → client `Challenge { server_nonce, server_proof = HMAC(secret, "server" | cn | sn) }`
//! 3. client checks the server's proof, then → `AuthProof { HMAC(secret, "client" | sn | cn) }`
//! 4. server checks it → `Welcome` or `Denied(reason)`, and logs a denial.
//!
//! Both nonces are fresh random 32-byte values, so a recorded exchange cannot be
//! replayed. A server started with `--insecure` has no secret and says so in the
//! challenge; a client then skips the proofs.

use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::frame::{read_frame, write_frame, FrameKind, FrameLimits};
use crate::msg::{AuthProof, AuthResult, Challenge, Hello};

/// The wire protocol spoken after the handshake. Bumped whenever a message's encoding
/// changes, so a client and a server of different releases refuse each other with a
/// clear error instead of misreading frames. 2: composite layouts with DoM components
/// (`ComponentSpec::pattern`) and the PFL/DoM requests. 3: operations across MDTs
/// (`MdsUpdate` and its kin, `MdsMkdir::mdt`). 4: renames across MDTs
/// (`UpdateOp::RemoveEntry`; `MdsUpdateDone` names the participant MDT). 5: striped
/// directories (`Attr::stripes`, `MdsMkdir::spec`, `MdsReaddir::shard`, the shard
/// updates), directory moves and exchanges across MDTs. 6: a file's data version
/// (`Attr::data_version`). 7: a size report carries the attribute changes answered
/// by the client since the file's create (`MdsSizeUpdate::behind`). 8: OST pools
/// (`MgsPool`, `ClusterConfig::pools`, `MdsRefreshConfig`), emulated media
/// (`MgsHeartbeat::media`, `TargetInfo::media`), migration (`MdsReplaceLayout`) and
/// file-level mirrors (`Component::mirror` and `flags`, `LayoutChange::WriteIntent`).
/// 9: root squash (`ClusterConfig::root_squash`), lock and open replay
/// (`MdsSetLock::reclaim`, `MdsReclaimOpen`) and replicated MDTs
/// (`MgsRegister::epoch`, `MdtRaft`). 10: job ids after request messages
/// (`msg::encode_request`) and `Request::Metrics`. 11: directory migration between
/// MDTs (`MdsMigrate`, `UpdateOp::Adopt`/`Release`/`ReleasedTo`,
/// `Response::InodeCopy`/`Moved`). 12: files' inodes migrate too
/// (`Layout::objects`, `InodeCopy::symlink`/`dom`).
pub const PROTOCOL_VERSION: u32 = 12;
/// Shortest secret accepted, in bytes.
pub const SECRET_MIN_BYTES: usize = 16;
/// A peer that has not finished the handshake by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The cluster secret, or the explicit choice to run without one.
#[derive(Clone)]
pub enum Secret {
    Insecure,
    Key(Vec<u8>),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Insecure => f.write_str("Secret::Insecure"),
            Secret::Key(_) => f.write_str("Secret::Key(..)"),
        }
    }
}

impl Secret {
    /// Reads a secret file (surrounding whitespace ignored).
    pub fn load(path: &Path) -> Result<Secret, String> {
        let raw = std::fs::read(path).map_err(|e| format!("cannot read secret file {}: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&raw);
        let key = text.trim().as_bytes().to_vec();
        if key.len() < SECRET_MIN_BYTES {
            return Err(format!(
                "secret file {} holds {} bytes; at least {SECRET_MIN_BYTES} are required",
                path.display(),
                key.len()
            ));
        }
        Ok(Secret::Key(key))
    }

    /// Creates a new random secret file (mode 0600) unless one exists; returns it.
    pub fn create_file(path: &Path) -> Result<Secret, String> {
        if path.exists() {
            return Secret::load(path);
        }
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| format!("no randomness for a secret: {e}"))?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("cannot create secret file {}: {e}", path.display()))?;
        writeln!(f, "{hex}").map_err(|e| format!("cannot write secret file {}: {e}", path.display()))?;
        f.sync_all().map_err(|e| format!("cannot sync secret file {}: {e}", path.display()))?;
        Ok(Secret::Key(hex.into_bytes()))
    }
}

/// A number naming the cluster behind `secret` (and `fsname`), the same on every client
/// and every run, for a client's SSD cache to tell its bytes from another cluster's
/// (FIDs repeat across clusters). Without a secret, the MGS address stands in.
pub fn cluster_identity(secret: &Secret, fsname: &str, mgs: &str) -> u64 {
    let (key, extra): (&[u8], &str) = match secret {
        Secret::Key(k) => (k, ""),
        Secret::Insecure => (b"braid-insecure", mgs),
    };
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(b"braid-cache-identity-v1/");
    mac.update(fsname.as_bytes());
    mac.update(b"/");
    mac.update(extra.as_bytes());
    let out = mac.finalize().into_bytes();
    u64::from_le_bytes(out[..8].try_into().expect("a SHA-256 MAC has 32 bytes"))
}

fn proof(key: &[u8], label: &[u8], a: &[u8; 32], b: &[u8; 32]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(b"braid-auth-v1/");
    mac.update(label);
    mac.update(a);
    mac.update(b);
    mac.finalize().into_bytes().to_vec()
}

fn verify(key: &[u8], label: &[u8], a: &[u8; 32], b: &[u8; 32], got: &[u8]) -> bool {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(b"braid-auth-v1/");
    mac.update(label);
    mac.update(a);
    mac.update(b);
    mac.verify_slice(got).is_ok()
}

fn nonce() -> Result<[u8; 32], String> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| format!("no randomness: {e}"))?;
    Ok(n)
}

async fn send<W: AsyncWrite + Unpin, T: serde::Serialize>(w: &mut W, v: &T) -> Result<(), String> {
    let msg = postcard::to_stdvec(v).map_err(|e| format!("encode: {e}"))?;
    write_frame(w, FrameKind::Handshake, 0, &msg, &[]).await.map_err(|e| format!("send: {e}"))?;
    use tokio::io::AsyncWriteExt;
    w.flush().await.map_err(|e| format!("send: {e}"))
}

async fn recv<R: AsyncRead + Unpin, T: serde::de::DeserializeOwned>(r: &mut R) -> Result<T, String> {
    let limits = FrameLimits { max_msg_bytes: 4096, max_payload_bytes: 0 };
    let f = read_frame(r, &limits)
        .await
        .map_err(|e| format!("bad handshake frame: {e}"))?
        .ok_or_else(|| "peer closed the connection during the handshake".to_string())?;
    if f.kind != FrameKind::Handshake {
        return Err("peer sent a non-handshake frame before authenticating".into());
    }
    postcard::from_bytes(&f.msg).map_err(|e| format!("malformed handshake message: {e}"))
}

/// Why a client handshake failed; `denied` means the secret was wrong (not retryable).
#[derive(Debug)]
pub struct HandshakeError {
    pub denied: bool,
    pub reason: String,
}

/// Runs the client side of the handshake.
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &Secret,
    client_id: u64,
    role: &str,
) -> Result<(), HandshakeError> {
    let io = |reason: String| HandshakeError { denied: false, reason };
    let cn = nonce().map_err(io)?;
    let hello = Hello { protocol: PROTOCOL_VERSION, client_nonce: cn, client_id, role: role.to_string() };
    send(s, &hello).await.map_err(io)?;
    let ch: Challenge = recv(s).await.map_err(io)?;
    let mut server_proof_ok = true;
    let mut missing_secret = false;
    let client_proof = match (secret, ch.secured) {
        (Secret::Key(k), true) => {
            server_proof_ok = verify(k, b"server", &cn, &ch.server_nonce, &ch.server_proof);
            proof(k, b"client", &ch.server_nonce, &cn)
        }
        (_, false) => Vec::new(),
        (Secret::Insecure, true) => {
            missing_secret = true;
            Vec::new()
        }
    };
    // Even when the server's proof is wrong we answer, so the server logs the
    // mismatch too and both sides say why.
    send(s, &AuthProof { client_proof }).await.map_err(io)?;
    let result: AuthResult = recv(s).await.map_err(io)?;
    if missing_secret {
        return Err(HandshakeError {
            denied: true,
            reason: "the server requires the cluster secret; pass --secret-file or set BRAID_SECRET_FILE".into(),
        });
    }
    match result {
        AuthResult::Welcome if server_proof_ok => Ok(()),
        AuthResult::Welcome => Err(HandshakeError {
            denied: true,
            reason: "the server could not prove it knows the cluster secret".into(),
        }),
        AuthResult::Denied(why) => Err(HandshakeError { denied: true, reason: why }),
    }
}

/// Runs the server side; returns the client's hello on success.
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, secret: &Secret) -> Result<Hello, String> {
    server_handshake_or_refuse(s, secret, None).await
}

/// Runs the server side, and with `refuse` turns the client away at its end with
/// that reason, which the client reports as it would a wrong secret (a TLS-only
/// server's answer to a plain client: the refusal comes where the client expects a
/// verdict, so an older client says why too).
pub async fn server_handshake_or_refuse<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &Secret,
    refuse: Option<&str>,
) -> Result<Hello, String> {
    let hello: Hello = recv(s).await?;
    if hello.protocol != PROTOCOL_VERSION {
        let why = format!("protocol version {} is not supported (server speaks {PROTOCOL_VERSION})", hello.protocol);
        let _ = send(s, &AuthResult::Denied(why.clone())).await;
        return Err(why);
    }
    let sn = nonce()?;
    let (secured, server_proof) = match secret {
        Secret::Key(k) => (true, proof(k, b"server", &hello.client_nonce, &sn)),
        Secret::Insecure => (false, Vec::new()),
    };
    send(s, &Challenge { server_nonce: sn, secured, server_proof }).await?;
    let p: AuthProof = recv(s).await?;
    if let Secret::Key(k) = secret {
        if !verify(k, b"client", &sn, &hello.client_nonce, &p.client_proof) {
            let why = if p.client_proof.is_empty() {
                "the client has no cluster secret (it needs --secret-file or BRAID_SECRET_FILE)".to_string()
            } else {
                "wrong cluster secret (the client's proof does not match): give every node the same \
                 secret file (--secret-file, or secret_file in braid.toml)"
                    .to_string()
            };
            let _ = send(s, &AuthResult::Denied(why.clone())).await;
            return Err(why);
        }
    }
    if let Some(why) = refuse {
        let _ = send(s, &AuthResult::Denied(why.to_string())).await;
        return Err(why.to_string());
    }
    send(s, &AuthResult::Welcome).await?;
    Ok(hello)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(server: Secret, client: Secret) -> (Result<Hello, String>, Result<(), HandshakeError>) {
        let (mut a, mut b) = tokio::io::duplex(8192);
        let s = tokio::spawn(async move { server_handshake(&mut a, &server).await });
        let c = client_handshake(&mut b, &client, 42, "client").await;
        (s.await.unwrap(), c)
    }

    #[tokio::test]
    async fn same_secret_is_welcome() {
        let k = Secret::Key(b"0123456789abcdef0123".to_vec());
        let (s, c) = pair(k.clone(), k).await;
        assert_eq!(s.unwrap().client_id, 42);
        assert!(c.is_ok());
    }

    #[tokio::test]
    async fn wrong_secret_is_denied_on_both_sides() {
        let (s, c) =
            pair(Secret::Key(b"0123456789abcdef0123".to_vec()), Secret::Key(b"another-secret-000000".to_vec())).await;
        assert!(s.unwrap_err().contains("wrong cluster secret"));
        let c = c.unwrap_err();
        assert!(c.denied);
    }

    #[tokio::test]
    async fn missing_secret_is_explained() {
        let (_s, c) = pair(Secret::Key(b"0123456789abcdef0123".to_vec()), Secret::Insecure).await;
        assert!(c.unwrap_err().reason.contains("--secret-file"));
    }

    #[tokio::test]
    async fn insecure_server_accepts_anyone() {
        let (s, c) = pair(Secret::Insecure, Secret::Key(b"0123456789abcdef0123".to_vec())).await;
        assert!(s.is_ok() && c.is_ok());
    }
}
