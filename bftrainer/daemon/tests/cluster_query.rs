//! bftrainerd's query endpoint live (four-node cluster, both plugins, the cluster's own
//! munged): bftuser, with no way to its control socket, asks over TCP with `--server`
//! as from a login node and sees their own elastic job, not bftuser2's, with the same
//! output the socket gives; `pause` is refused; a credential sent twice, one made for
//! another purpose or another uid, and garbage are refused with a reason; the client
//! says so when munge is missing or nothing listens.

mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use bftrainer_daemon::daemon::control::{self, Op};
use bftrainer_slurm::munge::{auth_info_from_conf, Munge};
use live::Live;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};

/// `bftrainer ARGS` as `user` (bftuser or bftuser2), as on a login node: no config to
/// read (a path that does not exist) and none of the client's variables set.
fn as_user(l: &Live, user: &str, args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = bftrainer_testcluster::user_ids(user).unwrap();
    let mut c = l.c.command(env!("CARGO_BIN_EXE_bftrainer"));
    c.uid(uid)
        .gid(gid)
        .env("USER", user)
        .env("LOGNAME", user)
        .env_remove("BFTRAINER_SOCKET")
        .env_remove("BFTRAINER_SERVER")
        .env_remove("BFTRAINER_CONFIG")
        .env_remove("BFT_MUNGE_SOCKET")
        .current_dir("/tmp")
        .args(args)
        .args(["--config", "/nonexistent/bftrainer.toml"])
        .stdin(Stdio::null());
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("run bftrainer")
}

fn stdout_ok(o: Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn job_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("a job list")
        .iter()
        .map(|j| j["job_id"].as_u64().unwrap() as u32)
        .collect()
}

/// Root's view over the control socket.
fn root_json(l: &Live, args: &[&str]) -> serde_json::Value {
    let mut c = l.c.command(env!("CARGO_BIN_EXE_bftrainer"));
    c.args(args)
        .args(["--json", "--config"])
        .arg(&l.conf)
        .stdin(Stdio::null());
    serde_json::from_str(&stdout_ok(run(c), "bftrainer as root")).unwrap()
}

/// A MUNGE credential made as `user` through the cluster's munged.
fn munge_as(l: &Live, user: &str, decoder: &str, payload: &str) -> String {
    let conf = std::fs::read_to_string(l.c.slurm_conf()).unwrap();
    let socket = Munge::from_auth_info(None, auth_info_from_conf(&conf).as_deref())
        .socket
        .expect("the test cluster's slurm.conf names its munged in AuthInfo");
    let mut c = l.c.command("runuser");
    c.args([
        "-u", user, "--", "munge", "-S", &socket, "-u", decoder, "-s", payload,
    ])
    .stdin(Stdio::null());
    stdout_ok(run(c), "munge").trim().to_string()
}

/// The test cluster's munged socket (its slurm.conf's AuthInfo).
fn munge_socket(l: &Live) -> String {
    let conf = std::fs::read_to_string(l.c.slurm_conf()).unwrap();
    Munge::from_auth_info(None, auth_info_from_conf(&conf).as_deref())
        .socket
        .expect("the test cluster's slurm.conf names its munged in AuthInfo")
}

/// A user's squatter on the query port (argv: port, record file, munged socket): it
/// serves one connection, answering the hello with a credential of its own user for
/// the payload a genuine proof carries, and records all it receives.
const SQUATTER: &str = r#"
import socket, subprocess, sys
port, rec, sock = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
s.settimeout(120)  # gone by itself if the test fails before its connection
open(rec + ".ready", "w").close()
c, _ = s.accept()
c.settimeout(120)
f = c.makefile("rb")
hello = f.readline()
nonce = hello.split()[-1].decode() if hello.split() else ""
payload = "bftrainer-server:v2 %s 127.0.0.1:%d" % (nonce, port)
cred = subprocess.run(["munge", "-S", sock, "-s", payload], capture_output=True, text=True).stdout.strip()
c.sendall((cred + "\n").encode())
rest = f.read()
open(rec, "wb").write(b"hello " + hello + b"rest " + rest + b"\n")
"#;

/// One line to the endpoint, its answer (JSON).
fn raw(server: &str, line: &[u8]) -> serde_json::Value {
    let mut s = TcpStream::connect(server).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    s.write_all(line).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)))
}

#[test]
fn cluster_query_users_on_login_nodes_see_their_own_jobs_read_only() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("127.0.0.1:{port}");
    let mut l = Live::start_without_daemon("", &format!("query_listen = \"{server}\""), "");
    let user = bftrainer_testcluster::TEST_USER;
    let other = bftrainer_testcluster::OTHER_USER;

    // 0. Issue 33, item 14: bftuser binds the port before bftrainerd starts, and
    //    answers the client's hello with a credential of their own. bftrainerd runs
    //    anyway and names the squatter; bftuser2's client refuses the squatter before
    //    it sends its credential; once the squatter leaves, the endpoint comes up.
    let squat = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        squat.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let got = squat.path().join("received");
    let mut squatter =
        l.c.command("runuser")
            .args([
                "-u",
                user,
                "--",
                "python3",
                "-c",
                SQUATTER,
                &port.to_string(),
            ])
            .arg(&got)
            .arg(munge_socket(&l))
            .stdin(Stdio::null())
            .spawn()
            .expect("start the squatter");
    l.wait(30, "the squatter on the port", || {
        got.with_extension("ready").exists().then_some(())
    });
    l.spawn();
    let (squatter_uid, _) = bftrainer_testcluster::user_ids(user).unwrap();
    let held = format!("the port is held by uid {squatter_uid} ({user}), pid ");
    l.wait(60, "bftrainerd naming the squatter", || {
        l.log_text().contains(&held).then_some(())
    });
    // Running, not restarting: it answers on its control socket and says why the
    // endpoint is missing.
    let st = root_json(&l, &["status"]);
    let problems = st["listen_problems"].to_string();
    assert!(
        problems.contains("[daemon] query_listen") && problems.contains(&held),
        "{st}"
    );
    let o = run(as_user(&l, other, &["jobs", "--server", server.as_str()]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("did not prove it is bftrainerd (root)")
            && err.contains(&format!("made by uid {squatter_uid}, not root")),
        "{err}"
    );
    assert!(squatter.wait().unwrap().success(), "the squatter failed");
    let received = std::fs::read_to_string(&got).unwrap();
    assert!(
        received.starts_with("hello bftrainer-hello:v2 ") && !received.contains("MUNGE:"),
        "the squatter received {received:?}"
    );
    assert!(
        received.ends_with("rest \n"),
        "the squatter received {received:?}"
    );
    l.wait(30, "the query endpoint", || {
        TcpStream::connect(&server).ok().map(|_| ())
    });
    let mine = l.submit_elastic("1:2");
    let theirs = l.submit_elastic_as(other, "1:2");
    // Both jobs hold 2 nodes each: nothing left to change in the views below.
    l.wait(90, "both elastic jobs at 2 nodes", || {
        let jobs = root_json(&l, &["jobs"]);
        let sizes: Vec<(u32, u64)> = jobs
            .as_array()?
            .iter()
            .map(|j| {
                (
                    j["job_id"].as_u64().unwrap() as u32,
                    j["size"].as_u64().unwrap(),
                )
            })
            .collect();
        (sizes.contains(&(mine, 2)) && sizes.contains(&(theirs, 2))).then_some(())
    });

    // 1. bftuser over TCP: their job, not bftuser2's; with no socket to reach.
    let server_args = ["--server", server.as_str()];
    let out = stdout_ok(
        run(as_user(
            &l,
            user,
            &[&["jobs", "--json"][..], &server_args].concat(),
        )),
        "bftrainer jobs --server",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(job_ids(&v), [mine], "{out}");
    let out = stdout_ok(
        run(as_user(
            &l,
            other,
            &[&["jobs", "--json"][..], &server_args].concat(),
        )),
        "bftrainer jobs --server as bftuser2",
    );
    assert_eq!(job_ids(&serde_json::from_str(&out).unwrap()), [theirs]);
    // $BFTRAINER_SERVER does the same.
    let mut c = as_user(&l, user, &["status", "--json"]);
    c.env("BFTRAINER_SERVER", &server);
    let st: serde_json::Value =
        serde_json::from_str(&stdout_ok(run(c), "BFTRAINER_SERVER status")).unwrap();
    assert_eq!(st["counts"]["lent"], 4, "{st}");
    // Without --server the socket is looked for and not found: the command fails.
    let o = run(as_user(&l, user, &["jobs"]));
    assert!(!o.status.success());

    // 2. The same output through both doors (the socket is reachable from here); a
    //    node-hours figure may tick between the two calls: compare until they agree.
    let sock = l.dir.join("state/bftrainerd.sock");
    let sock = sock.to_str().unwrap();
    for cmd in ["jobs", "nodes"] {
        let tcp = l.wait(
            30,
            &format!("`bftrainer {cmd}` alike through both doors"),
            || {
                let tcp = stdout_ok(
                    run(as_user(&l, user, &[&[cmd][..], &server_args].concat())),
                    cmd,
                );
                let local = stdout_ok(run(as_user(&l, user, &[cmd, "--socket", sock])), cmd);
                (tcp == local).then_some(tcp)
            },
        );
        assert!(tcp.lines().count() > 1, "{tcp}");
    }
    let nodes = stdout_ok(
        run(as_user(&l, user, &[&["nodes"][..], &server_args].concat())),
        "nodes",
    );
    let holders: Vec<&str> = nodes
        .lines()
        .skip(1)
        .filter_map(|r| r.split_whitespace().nth(2))
        .collect();
    let mine_s = mine.to_string();
    assert_eq!(
        holders.iter().filter(|h| **h == mine_s).count(),
        2,
        "{nodes}"
    );
    assert_eq!(holders.iter().filter(|h| **h == "-").count(), 2, "{nodes}");

    // 3. Admin verbs are refused over TCP, whoever asks; lending stays open.
    for who in [user, "root"] {
        let c = if who == "root" {
            let mut c = l.c.command(env!("CARGO_BIN_EXE_bftrainer"));
            c.args(["pause", "--server", &server])
                .stdin(Stdio::null())
                .env_remove("BFTRAINER_SERVER");
            c
        } else {
            as_user(&l, who, &["pause", "--server", &server])
        };
        let o = run(c);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("the query endpoint is read-only"),
            "pause over TCP as {who}: {err}"
        );
    }
    assert_eq!(root_json(&l, &["status"])["lending"], "open");

    // 4. A credential is good once, for the request it carries.
    let payload = control::query_payload(Op::Jobs {
        user: None,
        job_ids: vec![],
        history: false,
    });
    let cred = munge_as(&l, user, "root", &payload);
    let line = format!("{cred}\n");
    let first = raw(&server, line.as_bytes());
    assert_eq!(first["ok"], true, "{first}");
    assert_eq!(job_ids(&first["data"]), [mine]);
    let again = raw(&server, line.as_bytes());
    assert_eq!(again["ok"], false);
    assert_eq!(
        again["error"], "credential refused: replayed credential",
        "{again}"
    );
    // Made for something else (bft-run's handshake), or for another uid to decode.
    let elsewhere = munge_as(&l, user, "root", "bftrainer-run:v2 agent job=1 run=x");
    let r = raw(&server, format!("{elsewhere}\n").as_bytes());
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("not made for a bftrainerd query"),
        "{r}"
    );
    let for_user = munge_as(&l, user, user, &payload);
    let r = raw(&server, format!("{for_user}\n").as_bytes());
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("only another uid may decode"),
        "{r}"
    );

    // 5. Garbage gets an error answer, and the endpoint keeps serving.
    for line in [
        &b"hello\n"[..],
        b"\n",
        b"{\"v\":1,\"op\":\"jobs\"}\n",
        b"MUNGE:AAAAnotacredential:\n",
        b"\xff\xfe\x00\x01\n",
    ] {
        let r = raw(&server, line);
        assert_eq!(r["ok"], false, "{line:?}: {r}");
        assert!(!r["error"].as_str().unwrap().is_empty(), "{r}");
    }
    let out = stdout_ok(
        run(as_user(
            &l,
            user,
            &[&["jobs", "--json"][..], &server_args].concat(),
        )),
        "bftrainer jobs --server after garbage",
    );
    assert_eq!(job_ids(&serde_json::from_str(&out).unwrap()), [mine]);

    // 6. The client says what is wrong: no munge, nothing listening.
    let mut c = as_user(&l, user, &[&["jobs"][..], &server_args].concat());
    c.env("PATH", "/nonexistent");
    let o = run(c);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("is the munge package installed"),
        "{err}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = closed.local_addr().unwrap().to_string();
    drop(closed);
    let o = run(as_user(&l, user, &["jobs", "--server", &nobody]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("cannot reach bftrainerd's query endpoint"),
        "{err}"
    );
}
