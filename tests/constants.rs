//! Checks slurm-sys's constants against the installed headers: a small C program,
//! compiled with the system `cc` at test time, prints the C values and we compare.

use std::path::PathBuf;
use std::process::Command;

/// Lists each constant once: the macro yields its name (for the C side) and its Rust
/// value widened losslessly to i128, so a sign or width error (NO_VAL64 as -2) shows.
macro_rules! consts {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), i128::from(slurm_sys::$name))),*]
    };
}

fn rust_values() -> Vec<(&'static str, i128)> {
    consts![
        SLURM_VERSION_NUMBER,
        NO_VAL,
        NO_VAL8,
        NO_VAL16,
        NO_VAL64,
        INFINITE,
        INFINITE16,
        INFINITE64,
        NODE_STATE_BASE,
        NODE_STATE_FLAGS,
        NODE_STATE_IDLE,
        NODE_STATE_ALLOCATED,
        NODE_STATE_MIXED,
        NODE_STATE_DOWN,
        NODE_STATE_DRAIN,
        NODE_STATE_PLANNED,
        NODE_STATE_COMPLETING,
        NODE_STATE_NO_RESPOND,
        NODE_STATE_POWERED_DOWN,
        NODE_STATE_FAIL,
        NODE_STATE_MAINT,
        NODE_STATE_RES,
        NODE_STATE_INVALID_REG,
        NODE_STATE_DYNAMIC_NORM,
        JOB_STATE_BASE,
        JOB_STATE_FLAGS,
        JOB_PENDING,
        JOB_RUNNING,
        JOB_PREEMPTED,
        JOB_END,
        JOB_REQUEUE,
        JOB_REQUEUE_HOLD,
        JOB_COMPLETING,
        JOB_CONFIGURING,
        JOB_RESIZING,
        JOB_STAGE_OUT,
        JOBCOND_FLAG_DUP,
        JOBCOND_FLAG_NO_STEP,
        JOBCOND_FLAG_NO_TRUNC,
        KILL_JOB_BATCH,
        KILL_FULL_JOB,
        SHOW_ALL,
        SHOW_DETAIL,
        SHOW_MIXED,
        PREEMPT_MODE_REQUEUE,
        PARTITION_UP,
        SLURM_SUCCESS,
        SLURM_ERROR,
        SLURM_NO_CHANGE_IN_DATA,
        ESLURM_INVALID_JOB_ID,
        ESLURM_ALREADY_DONE,
        ESPANK_SUCCESS,
        S_JOB_UID,
    ]
}

fn c_program(names: &[&str]) -> String {
    let mut src = String::from(
        "#include <stdio.h>\n#include <stdint.h>\n#include <slurm/slurm.h>\n\
         #include <slurm/slurmdb.h>\n#include <slurm/spank.h>\n\
         static void s(const char *n, long long v) { printf(\"%s=%lld\\n\", n, v); }\n\
         static void u(const char *n, unsigned long long v) { printf(\"%s=%llu\\n\", n, v); }\n\
         /* Print with the C type's own signedness. */\n\
         #define P(x) _Generic((x), signed char: s, short: s, int: s, long: s, \\\n\
           long long: s, default: u)(#x, (x))\n\
         int main(void) {\n",
    );
    for n in names {
        src.push_str(&format!("    P({n});\n"));
    }
    src.push_str("    return 0;\n}\n");
    src
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("slurm-sys-consts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

#[test]
fn constants_match_installed_headers() {
    let rust = rust_values();
    let names: Vec<&str> = rust.iter().map(|(n, _)| *n).collect();
    let dir = scratch_dir();
    let src = dir.join("consts.c");
    let exe = dir.join("consts");
    std::fs::write(&src, c_program(&names)).unwrap();
    let include = std::env::var("SLURM_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".into());
    let cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg(format!("-I{include}"))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run the C compiler (`cc`; set CC to use another)");
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe)
        .output()
        .expect("run the compiled program");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    let mut mismatches = Vec::new();
    let mut seen = 0;
    for line in text.lines() {
        let (name, val) = line.split_once('=').expect("NAME=value line");
        let c_val: i128 = val.parse().expect("decimal value");
        let rust_val = rust.iter().find(|(n, _)| *n == name).unwrap().1;
        seen += 1;
        if c_val != rust_val {
            mismatches.push(format!("{name}: C {c_val:#x}, Rust {rust_val:#x}"));
        }
    }
    assert_eq!(seen, rust.len(), "the C program printed every constant");
    assert!(
        mismatches.is_empty(),
        "mismatches:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn version_exported_by_build_script_matches_header() {
    assert_eq!(
        slurm_sys::SLURM_VERSION_NUMBER_BUILT,
        slurm_sys::SLURM_VERSION_NUMBER
    );
    // The releases this project supports: 22.05, 24.11, 26.05.
    let v = slurm_sys::SLURM_VERSION_NUMBER;
    assert!(
        [(22, 5), (24, 11), (26, 5)]
            .iter()
            .any(|&(major, minor)| slurm_sys::slurm_version_num(major, minor, 0) >> 8 == v >> 8),
        "Slurm {} is not a supported release",
        slurm_sys::release::format(v)
    );
    assert_eq!(
        slurm_sys::release::parse(&slurm_sys::release::format(v)),
        Some(v)
    );
}

#[test]
fn node_state_flags_are_disjoint_from_base() {
    // The 64-bit sentinels must be unsigned 64-bit, as in C (bindgen alone gives -2).
    let _: u64 = slurm_sys::NO_VAL64;
    let _: u64 = slurm_sys::INFINITE64;
    for f in [
        slurm_sys::NODE_STATE_DRAIN,
        slurm_sys::NODE_STATE_PLANNED,
        slurm_sys::NODE_STATE_COMPLETING,
    ] {
        assert_eq!(f & slurm_sys::NODE_STATE_BASE as u64, 0);
        assert_eq!(f & slurm_sys::NODE_STATE_FLAGS as u64, f);
    }
}

/// The hand-declared allocator entry points resolve in the installed libslurm and
/// behave as 22.05's xmalloc.h says (xfree NULLs the pointer it was given).
#[cfg(feature = "link")]
#[test]
fn allocator_round_trip() {
    use std::ffi::{CStr, CString};
    let s = CString::new("bftrainer").unwrap();
    unsafe {
        let p = slurm_sys::slurm_xstrdup(s.as_ptr());
        assert!(!p.is_null());
        assert_ne!(p.cast_const(), s.as_ptr(), "a copy, not the same buffer");
        assert_eq!(CStr::from_ptr(p).to_str().unwrap(), "bftrainer");
        let mut v = p.cast::<std::os::raw::c_void>();
        slurm_sys::slurm_xfree(&mut v);
        assert!(v.is_null());
        // xfree of a NULL pointer is a no-op (Slurm frees optional fields this way).
        slurm_sys::slurm_xfree(&mut v);
        assert!(v.is_null());
        assert!(slurm_sys::slurm_xstrdup(std::ptr::null()).is_null());
        let z = slurm_sys::slurm_xcalloc(4, 8, true, false, c"t".as_ptr(), 1, c"t".as_ptr());
        assert!(!z.is_null());
        assert!(std::slice::from_raw_parts(z.cast::<u8>(), 32)
            .iter()
            .all(|b| *b == 0));
        slurm_sys::slurm_xfree_ptr(z);
        assert!(
            slurm_sys::slurm_xcalloc(0, 8, true, false, c"t".as_ptr(), 1, c"t".as_ptr()).is_null()
        );
    }
}

/// The release table names the installed libslurm: slurm_api_version() (libslurm's
/// API_CURRENT) is the one listed for the release of the headers. The plugins rely on
/// this to recognise the release of the process that loads them.
#[cfg(feature = "link")]
#[test]
fn api_number_of_the_installed_libslurm_is_known() {
    let api = unsafe { slurm_sys::slurm_api_version() };
    assert_eq!(
        Some((api >> 16) as u32),
        slurm_sys::release::api_of(slurm_sys::SLURM_VERSION_NUMBER_BUILT),
        "slurm_api_version() = {api:#x}"
    );
}

/// The hand-declared name tables and destructor resolve in the installed libslurm with
/// the signatures src/lib.rs gives them.
#[cfg(feature = "link")]
#[test]
fn undeclared_exports_resolve() {
    use std::ffi::CStr;
    unsafe {
        let p = slurm_sys::compat::job_reason_string(slurm_sys::WAIT_PRIORITY);
        assert_eq!(CStr::from_ptr(p).to_str().unwrap(), "Priority");
        let p = slurm_sys::slurm_job_state_string(slurm_sys::JOB_RUNNING);
        assert_eq!(CStr::from_ptr(p).to_str().unwrap(), "RUNNING");
        let p = slurm_sys::slurm_node_state_string_complete(slurm_sys::NODE_STATE_IDLE);
        assert_eq!(CStr::from_ptr(p).to_str().unwrap(), "IDLE");
        let mut v = p.cast::<std::os::raw::c_void>();
        slurm_sys::slurm_xfree(&mut v);
        // NULL is a no-op (checked in the source of all three releases).
        slurm_sys::slurm_free_will_run_response_msg(std::ptr::null_mut());
    }
}

#[test]
fn release_numbers_format_and_parse() {
    use slurm_sys::release;
    assert_eq!(release::format(0x18_0b_05), "24.11.5");
    assert_eq!(release::series(0x1a_05_05), "26.05");
    assert_eq!(release::parse("22.05.8"), Some(0x16_05_08));
    assert_eq!(release::parse("24.11.0-0rc1"), Some(0x18_0b_00));
    assert_eq!(release::parse("26.05"), Some(0x1a_05_00));
    assert_eq!(release::parse("x.y"), None);
    assert!(release::same_series(0x16_05_08, 0x16_05_02));
    assert!(!release::same_series(0x16_05_08, 0x18_0b_05));
    assert_eq!(release::api_of(0x18_0b_05), Some(42));
    assert_eq!(release::series_of_api(45).as_deref(), Some("26.05"));
    assert_eq!(
        release::describe_api(38 << 16),
        "Slurm 22.05 (libslurm API 38)"
    );
}
