//! The wire format (docs/design.md, "Elastic runtime"): one JSON object per line, at
//! most [`MAX_LINE`] bytes, each with a type `t`.

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The protocol version agents and coordinators must share.
pub const PROTO: u64 = 1;
pub const MAX_LINE: usize = 1 << 20;

/// Writes `line` and a newline to stderr in one write. The coordinator and the agents
/// share the job's output file, and `eprintln!` writes a formatted line in pieces that
/// interleave with other processes' (a pipe keeps writes up to 4 KiB whole).
pub fn write_err(line: String) {
    use std::io::Write;
    let mut line = line;
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// As [`write_err`], to stdout (workers' output lines).
pub fn write_out(line: String) {
    use std::io::Write;
    let mut line = line;
    line.push('\n');
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

static VERBOSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `-v`: trace every message and connection problem on stderr.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, std::sync::atomic::Ordering::Relaxed);
}

pub fn verbose() -> bool {
    VERBOSE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The payload an agent's MUNGE credential carries: binds it to one job and one
/// connection (the coordinator's nonce).
pub fn cred_payload(job: &str, nonce: &str) -> String {
    format!("bftrainer-run:v1 job={job} nonce={nonce}")
}

/// Reads one line (without the newline). `Ok(None)` at end of stream; an error for a
/// line over [`MAX_LINE`], bad UTF-8 or bad JSON, or a JSON value without a string `t`.
pub async fn read_msg<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Value>, String> {
    let mut buf = Vec::new();
    loop {
        let avail = r
            .fill_buf()
            .await
            .map_err(|e| format!("read failed: {e}"))?;
        if avail.is_empty() {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err("the connection closed in the middle of a line".into())
            };
        }
        let (chunk, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], Some(i + 1)),
            None => (avail, None),
        };
        if buf.len() + chunk.len() > MAX_LINE {
            return Err(format!("a line over {MAX_LINE} bytes"));
        }
        buf.extend_from_slice(chunk);
        let used = done.unwrap_or(avail.len());
        r.consume(used);
        if done.is_some() {
            return parse(&buf).map(Some);
        }
    }
}

pub fn parse(line: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| format!("not a JSON line: {e}"))?;
    if !v.get("t").is_some_and(Value::is_string) {
        return Err("a message without a string field \"t\"".into());
    }
    Ok(v)
}

pub fn line(v: &Value) -> String {
    let mut s = v.to_string();
    s.push('\n');
    s
}

pub fn error(msg: &str) -> String {
    line(&json!({"t": "error", "msg": msg}))
}

pub fn t(v: &Value) -> &str {
    v.get("t").and_then(Value::as_str).unwrap_or("")
}

pub fn str_field<'a>(v: &'a Value, k: &str) -> Result<&'a str, String> {
    v.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("message {:?} lacks the string field {k:?}", t(v)))
}

pub fn u64_field(v: &Value, k: &str) -> Result<u64, String> {
    v.get(k)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("message {:?} lacks the whole-number field {k:?}", t(v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    fn read_all(input: &[u8]) -> Vec<Result<Option<Value>, String>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut r = BufReader::with_capacity(7, input);
            let mut out = Vec::new();
            loop {
                let m = read_msg(&mut r).await;
                let end = !matches!(m, Ok(Some(_)));
                out.push(m);
                if end {
                    return out;
                }
            }
        })
    }

    #[test]
    fn lines_split_across_reads_and_the_limits() {
        let got = read_all(b"{\"t\":\"ready\",\"worker\":\"1.0\"}\n{\"t\":\"done\"}\n");
        assert_eq!(got.len(), 3);
        assert_eq!(t(got[0].as_ref().unwrap().as_ref().unwrap()), "ready");
        assert_eq!(got[2], Ok(None));
        for (input, want) in [
            (&b"garbage\n"[..], "not a JSON line"),
            (b"{\"x\":1}\n", "without a string field"),
            (b"[1,2]\n", "without a string field"),
            (b"{\"t\":\"ready\"", "closed in the middle"),
        ] {
            let got = read_all(input);
            let e = got.last().unwrap().clone().unwrap_err();
            assert!(e.contains(want), "{input:?}: {e}");
        }
        let mut big = vec![b'a'; MAX_LINE + 10];
        big.push(b'\n');
        let e = read_all(&big).pop().unwrap().unwrap_err();
        assert!(e.contains("over"), "{e}");
    }

    #[test]
    fn fields_say_what_is_missing() {
        let v = parse(br#"{"t":"gen","gen":"x"}"#).unwrap();
        assert!(u64_field(&v, "gen").unwrap_err().contains("\"gen\""));
        assert!(str_field(&v, "store").unwrap_err().contains("\"store\""));
        assert_eq!(cred_payload("7", "ab"), "bftrainer-run:v1 job=7 nonce=ab");
    }
}
