//! MUNGE credentials through the `munge` and `unmunge` clients (every Slurm node has
//! them): the maker proves its uid; the decoder checks uid, payload and freshness
//! (munged refuses a credential decoded twice, and one past its TTL). Used by bft-run
//! (agents and coordinator prove themselves to each other) and by bftrainerd's query
//! endpoint (a user on a login node proves who asks).

use std::io::Write;
use std::process::{Command, Stdio};

/// Why `unmunge` refused a credential made with `munge -u` for another uid.
const UNAUTHORIZED: &str =
    "a credential that only another uid may decode (its maker meant it for another recipient: another user than this job's owner, or another daemon)";

/// Where munged listens: `BFT_MUNGE_SOCKET`, else the `socket=` of Slurm's AuthInfo,
/// else munge's default.
#[derive(Debug, Clone, Default)]
pub struct Munge {
    pub socket: Option<String>,
}

/// What a credential said.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub uid: u32,
    pub payload: String,
}

impl Munge {
    /// `env` (`BFT_MUNGE_SOCKET`) if set, else the `socket=` of `auth_info` (Slurm's
    /// AuthInfo), else munge's default socket.
    pub fn from_auth_info(env: Option<String>, auth_info: Option<&str>) -> Munge {
        let socket = env.filter(|s| !s.is_empty()).or_else(|| {
            auth_info?
                .split(',')
                .find_map(|kv| kv.trim().strip_prefix("socket="))
                .map(str::to_string)
        });
        Munge { socket }
    }

    /// As [`Munge::from_auth_info`] with `BFT_MUNGE_SOCKET` and the AuthInfo of the
    /// local slurm.conf ([`crate::config_path`]), as Slurm's own clients on this host
    /// find munged; no call to slurmctld. A slurm.conf that cannot be read, or that sets
    /// AuthInfo only in an `Include`d file, leaves munge's default socket.
    pub fn for_this_host() -> Munge {
        let conf = std::fs::read_to_string(crate::config_path()).unwrap_or_default();
        Munge::from_auth_info(
            std::env::var("BFT_MUNGE_SOCKET").ok(),
            auth_info_from_conf(&conf).as_deref(),
        )
    }

    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        if let Some(s) = &self.socket {
            c.arg("-S").arg(s);
        }
        c
    }

    /// A credential of this process's uid carrying `payload`, that only a process of
    /// uid `decoder` can decode (`munge --restrict-uid`): handed to an impostor of
    /// another uid, it is of no use to it. (slurmctld refuses it as an RPC's credential
    /// for another reason: its payload is not the hash of an RPC.)
    pub fn encode(&self, payload: &str, decoder: u32) -> Result<String, String> {
        self.munge(&["-u", &decoder.to_string(), "-s", payload])
    }

    /// A credential of this process's uid carrying `payload` that any uid may decode:
    /// bftrainerd's proof to query clients that it runs as root.
    pub fn encode_for_anyone(&self, payload: &str) -> Result<String, String> {
        self.munge(&["-s", payload])
    }

    /// Runs `munge ARGS` and returns the credential it printed.
    fn munge(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .cmd("munge")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run munge: {e} (is the munge package installed?)"))?;
        if !out.status.success() {
            return Err(format!(
                "munged is not running or refused the credential: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Decodes `cred`; an error says why it is not acceptable.
    pub fn decode(&self, cred: &str) -> Result<Decoded, String> {
        let mut child = self
            .cmd("unmunge")
            .arg("-N")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run unmunge: {e}"))?;
        if let Some(mut i) = child.stdin.take() {
            let _ = i.write_all(cred.as_bytes());
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("unmunge failed: {e}"))?;
        parse_unmunge(&String::from_utf8_lossy(&out.stdout)).map_err(|why| {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("Unauthorized credential") {
                // munge -u: the maker meant it for another uid.
                return UNAUTHORIZED.to_string();
            }
            if err.trim().is_empty() {
                why
            } else {
                format!("{why} ({})", err.trim())
            }
        })
    }
}

/// The value of `AuthInfo=` in slurm.conf text (keys are case-insensitive; the last
/// one wins, as in Slurm; `#` starts a comment), if set.
pub fn auth_info_from_conf(text: &str) -> Option<String> {
    text.lines().rev().find_map(|l| {
        let l = l.split('#').next().unwrap_or("").trim();
        let (k, v) = l.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("AuthInfo")
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// `unmunge -N` output: `KEY: value` lines, a blank line, the payload.
pub fn parse_unmunge(out: &str) -> Result<Decoded, String> {
    let (meta, payload) = out.split_once("\n\n").unwrap_or((out, ""));
    let field = |k: &str| {
        meta.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim_start_matches(':').trim().parse::<u32>().ok())
    };
    match field("STATUS") {
        Some(0) => {}
        Some(15) => return Err("expired credential".into()),
        Some(16) => return Err("credential from the future (clock skew)".into()),
        Some(17) => return Err("replayed credential".into()),
        Some(18) => return Err(UNAUTHORIZED.into()),
        Some(s) => return Err(format!("invalid credential (munge status {s})")),
        None => return Err("invalid credential".into()),
    }
    let uid = field("UID").ok_or("unmunge printed no UID")?;
    Ok(Decoded {
        uid,
        payload: payload.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_from_env_then_auth_info() {
        assert_eq!(
            Munge::from_auth_info(None, Some("cred_expire=15,socket=/x/m.sock")).socket,
            Some("/x/m.sock".into())
        );
        assert_eq!(
            Munge::from_auth_info(Some("/e".into()), Some("socket=/x")).socket,
            Some("/e".into())
        );
        assert_eq!(
            Munge::from_auth_info(None, Some("cred_expire=15")).socket,
            None
        );
        assert_eq!(Munge::from_auth_info(None, None).socket, None);
    }

    #[test]
    fn auth_info_from_slurm_conf() {
        let conf = "# AuthInfo=socket=/commented\nAuthType=auth/munge\n\
                    authinfo = \"socket=/x/m.sock,cred_expire=15\" # ours\n";
        assert_eq!(
            auth_info_from_conf(conf).as_deref(),
            Some("socket=/x/m.sock,cred_expire=15")
        );
        assert_eq!(
            Munge::from_auth_info(None, auth_info_from_conf(conf).as_deref()).socket,
            Some("/x/m.sock".into())
        );
        assert_eq!(auth_info_from_conf("AuthType=auth/munge\n"), None);
    }

    #[test]
    fn unmunge_output_statuses() {
        let ok = "STATUS:          0\nENCODE_HOST:     127.0.0.1\nUID:             1002\nGID:             1002\nLENGTH:          5\n\nhello";
        assert_eq!(
            parse_unmunge(ok),
            Ok(Decoded {
                uid: 1002,
                payload: "hello".into()
            })
        );
        let replay = ok.replace("STATUS:          0", "STATUS:          17");
        assert_eq!(parse_unmunge(&replay), Err("replayed credential".into()));
        let other = ok.replace("STATUS:          0", "STATUS:          18");
        assert!(parse_unmunge(&other).unwrap_err().contains("another uid"));
        assert!(parse_unmunge("").unwrap_err().contains("invalid"));
        assert!(parse_unmunge("STATUS: 0\n\nx").unwrap_err().contains("UID"));
    }
}
