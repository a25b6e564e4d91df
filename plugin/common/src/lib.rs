//! The one door through which both plugins talk to their Slurm host: a panic-catching
//! trampoline for every exported hook, logging through Slurm's logger, xmalloc'd strings.
//!
//! Slurm's functions are looked up once with `dlsym(RTLD_DEFAULT)` instead of being
//! linked: inside slurmctld/sbatch/slurmstepd they resolve to the host's libslurmfull,
//! and in unit tests (no Slurm loaded) logging falls back to stderr and xmalloc refuses,
//! so every test binary links without Slurm and the plugin carries no DT_NEEDED on it.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{self, AssertUnwindSafe};
use std::sync::OnceLock;

/// Slurm's error return for plugin hooks (`SLURM_ERROR`).
pub const SLURM_ERROR: c_int = -1;
/// Slurm's success return (`SLURM_SUCCESS`).
pub const SLURM_SUCCESS: c_int = 0;

type LogFn = unsafe extern "C" fn(*const c_char, ...);
type XstrdupFn = unsafe extern "C" fn(*const c_char) -> *mut c_char;
type XfreeFn = unsafe extern "C" fn(*mut *mut c_void);
type ApiVersionFn = unsafe extern "C" fn() -> std::ffi::c_long;

struct Host {
    error: Option<LogFn>,
    info: Option<LogFn>,
    verbose: Option<LogFn>,
    debug: Option<LogFn>,
    debug2: Option<LogFn>,
    xstrdup: Option<XstrdupFn>,
    xfree: Option<XfreeFn>,
    api_version: Option<ApiVersionFn>,
}

fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| {
        // SAFETY: each symbol, when present, is the libslurm function of that name,
        // whose C signature the target type mirrors (checked against Slurm 22.05's
        // log.h/xmalloc.h/xstring.h: slurm_xfree(void **), slurm_xstrdup(const char *)).
        unsafe {
            let log = |n: &CStr| lookup(n).map(|p| std::mem::transmute::<*mut c_void, LogFn>(p));
            Host {
                error: log(c"slurm_error"),
                info: log(c"slurm_info"),
                verbose: log(c"slurm_verbose"),
                debug: log(c"slurm_debug"),
                debug2: log(c"slurm_debug2"),
                xstrdup: lookup(c"slurm_xstrdup")
                    .map(|p| std::mem::transmute::<*mut c_void, XstrdupFn>(p)),
                xfree: lookup(c"slurm_xfree")
                    .map(|p| std::mem::transmute::<*mut c_void, XfreeFn>(p)),
                // `long slurm_api_version(void)` (slurm.h, every release).
                api_version: lookup(c"slurm_api_version")
                    .map(|p| std::mem::transmute::<*mut c_void, ApiVersionFn>(p)),
            }
        }
    })
}

/// Log levels of Slurm's logger that the plugins use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Info,
    Verbose,
    Debug,
    Debug2,
}

/// A NUL-free C copy of `s`: interior NULs (possible in user-supplied text) become '?'.
pub fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "?")).unwrap_or_default()
}

/// Logs `msg` through Slurm's logger with a fixed "%s" format, so user text inside the
/// message can never be read as a format string.
pub fn log(level: Level, msg: &str) {
    let h = host();
    let f = match level {
        Level::Error => h.error,
        Level::Info => h.info,
        Level::Verbose => h.verbose,
        Level::Debug => h.debug,
        Level::Debug2 => h.debug2,
    };
    let text = c_string(msg);
    match f {
        // SAFETY: "%s" consumes exactly the one NUL-terminated string passed.
        Some(f) => unsafe { f(c"%s".as_ptr(), text.as_ptr()) },
        None => eprintln!("{level:?}: {msg}"),
    }
}

/// A logger that prefixes every line with the plugin type ("job_submit/bftrainer: ...").
#[derive(Debug, Clone, Copy)]
pub struct Logger(pub &'static str);

impl Logger {
    pub fn error(self, msg: &str) {
        log(Level::Error, &format!("{}: {msg}", self.0));
    }
    pub fn info(self, msg: &str) {
        log(Level::Info, &format!("{}: {msg}", self.0));
    }
    pub fn verbose(self, msg: &str) {
        log(Level::Verbose, &format!("{}: {msg}", self.0));
    }
    pub fn debug(self, msg: &str) {
        log(Level::Debug, &format!("{}: {msg}", self.0));
    }
    pub fn debug2(self, msg: &str) {
        log(Level::Debug2, &format!("{}: {msg}", self.0));
    }
}

/// Why a plugin built for Slurm `built` (SLURM_VERSION_NUMBER) must not run in a host
/// whose libslurm reports `slurm_api_version()` = `running_api`, or `None` when it
/// may. Slurm exports no release number to plugins, but the libslurm API number
/// (API_CURRENT, one per release series) identifies the series; within a series Slurm's
/// own loader checks the rest (the micro for job_submit, nothing more for SPANK).
pub fn release_mismatch(plugin: &str, built: u32, running_api: i64) -> Option<String> {
    use slurm_sys::release;
    let expected = release::api_of(built);
    let running = (running_api >> 16) as u32;
    if expected == Some(running) {
        return None;
    }
    let ours = match expected {
        Some(api) => format!("Slurm {} (libslurm API {api})", release::format(built)),
        None => format!("Slurm {}", release::format(built)),
    };
    Some(format!(
        "{plugin} was built for {ours} but this process runs {}: refusing to load; \
         rebuild and reinstall it with `make install` against the running Slurm release",
        release::describe_api(running_api)
    ))
}

/// Checks the running Slurm against the release the plugin was built for; on a
/// mismatch logs why (Slurm's log and stderr, which slurmctld -D and sbatch show) and
/// returns false. Outside Slurm (no libslurm loaded) there is nothing to check.
pub fn release_ok(log: Logger, built: u32) -> bool {
    let Some(f) = host().api_version else {
        return true;
    };
    // SAFETY: slurm_api_version takes nothing and returns a long.
    let api = unsafe { f() };
    match release_mismatch(log.0, built, api) {
        None => true,
        Some(msg) => {
            // The message names the plugin itself: no Logger prefix.
            self::log(Level::Error, &msg);
            if host().error.is_some() {
                eprintln!("error: {msg}");
            }
            false
        }
    }
}

/// A copy of `s` in Slurm's allocator, for strings Slurm will `xfree` (err_msg, fields
/// of job_desc_msg_t). `None` when Slurm's allocator is not in this process: never
/// hand Slurm memory from another allocator.
pub fn xstrdup(s: &str) -> Option<*mut c_char> {
    let f = host().xstrdup?;
    let c = c_string(s);
    // SAFETY: slurm_xstrdup copies a NUL-terminated string into xmalloc'd memory.
    let p = unsafe { f(c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Frees an xmalloc'd string and nulls the pointer, like Slurm's `xfree()` macro.
///
/// # Safety
/// `*p` is null or was allocated by Slurm's allocator and is not used elsewhere.
pub unsafe fn xfree(p: &mut *mut c_char) {
    if p.is_null() {
        return;
    }
    match host().xfree {
        // SAFETY: per the contract above; slurm_xfree nulls *p itself.
        Some(f) => unsafe { f(p as *mut *mut c_char as *mut *mut c_void) },
        // Not inside Slurm: the string cannot be Slurm's, leak rather than corrupt.
        None => *p = std::ptr::null_mut(),
    }
}

/// Replaces an xmalloc'd string field of a Slurm struct with a copy of `value`.
///
/// # Safety
/// `*field` is null or xmalloc'd and owned by the struct.
pub unsafe fn set_field(field: &mut *mut c_char, value: &str) -> Result<(), NoAllocator> {
    let new = xstrdup(value).ok_or(NoAllocator)?;
    // SAFETY: forwarded from the caller.
    unsafe { xfree(field) };
    *field = new;
    Ok(())
}

/// Slurm's allocator is missing from this process (only ever true outside Slurm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoAllocator;

impl std::fmt::Display for NoAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("slurm_xstrdup is not available in this process")
    }
}

/// The bytes of a C string, `None` for a null pointer.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives `'a`.
pub unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: per the contract above.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// The entries of a C array of `n` C strings (Slurm's `char **env; uint32_t env_size`);
/// null entries are skipped.
///
/// # Safety
/// `arr` is null or points to `n` pointers, each null or a NUL-terminated string, all
/// outliving `'a`.
pub unsafe fn string_array<'a>(arr: *const *mut c_char, n: u32) -> Vec<&'a [u8]> {
    if arr.is_null() {
        return Vec::new();
    }
    // SAFETY: per the contract above.
    let ptrs = unsafe { std::slice::from_raw_parts(arr, n as usize) };
    ptrs.iter()
        // SAFETY: per the contract above.
        .filter_map(|&p| unsafe { bytes(p) })
        .collect()
}

thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Routes panic reports into a thread-local slot so the trampoline can log them through
/// Slurm; the hook belongs to this plugin's own copy of std, not to the host process.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        panic::set_hook(Box::new(|info| {
            let msg = match info.payload().downcast_ref::<&str>() {
                Some(s) => (*s).to_string(),
                None => info
                    .payload()
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "unknown panic payload".into()),
            };
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            // try_with: a panic while this thread's TLS is being torn down must not
            // become a second panic inside the hook (that aborts the host process).
            let _ = LAST_PANIC.try_with(|p| {
                if let Ok(mut slot) = p.try_borrow_mut() {
                    *slot = Some(format!("{msg}{at}"));
                }
            });
        }));
    });
}

/// The trampoline every exported hook goes through: runs `body`, and if it panics, logs
/// the panic through Slurm's logger and returns `on_panic` instead of unwinding into C.
pub fn guard<F>(log: Logger, hook: &str, on_panic: c_int, body: F) -> c_int
where
    F: FnOnce() -> c_int,
{
    install_panic_hook();
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(rc) => rc,
        Err(_) => {
            let why = LAST_PANIC
                .try_with(|p| p.try_borrow_mut().ok().and_then(|mut s| s.take()))
                .ok()
                .flatten()
                .unwrap_or_else(|| "no panic message".into());
            log.error(&format!(
                "{hook}: internal error, hook aborted ({why}); returning {on_panic}"
            ));
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: Logger = Logger("test/plugin");

    #[test]
    fn guard_passes_the_result_through() {
        assert_eq!(guard(LOG, "hook", SLURM_ERROR, || 7), 7);
    }

    #[test]
    fn guard_turns_a_panic_into_the_error_code() {
        let rc = guard(LOG, "hook", SLURM_ERROR, || panic!("boom {}", 1));
        assert_eq!(rc, SLURM_ERROR);
        // The slot was consumed by the trampoline.
        assert!(LAST_PANIC.with(|p| p.borrow().is_none()));
    }

    /// build.rs links the unwinder statically; this binary is linked the same way as the
    /// plugins, so a panic caught here with no libgcc_s in the process shows the trampoline
    /// still works without it (a broken static unwinder aborts instead of returning).
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn panics_are_caught_by_the_static_unwinder() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(
            !maps.contains("libgcc_s"),
            "libgcc_s.so is loaded: build.rs did not link libgcc_eh statically"
        );
        let rc = guard(LOG, "hook", -7, || {
            let v: Vec<c_int> = Vec::new();
            v[3]
        });
        assert_eq!(rc, -7);
    }

    #[test]
    fn the_same_release_series_loads() {
        // 22.05 (API 38), 24.11 (API 42), 26.05 (API 45): slurm_api_version() packs
        // (API_CURRENT - API_AGE, API_AGE, API_REVISION) like SLURM_VERSION_NUM.
        assert_eq!(release_mismatch("x", 0x16_05_08, 38 << 16), None);
        assert_eq!(release_mismatch("x", 0x18_0b_05, 42 << 16), None);
        assert_eq!(release_mismatch("x", 0x1a_05_05, 45 << 16), None);
    }

    #[test]
    fn another_release_is_refused_with_both_named() {
        let m = release_mismatch("job_submit/bftrainer", 0x16_05_08, 42 << 16).unwrap();
        assert!(
            m.starts_with("job_submit/bftrainer was built for Slurm 22.05.8"),
            "{m}"
        );
        assert!(m.contains("runs Slurm 24.11 (libslurm API 42)"), "{m}");
        assert!(m.contains("make install"), "{m}");
        let m = release_mismatch("spank/bftrainer", 0x1a_05_05, 50 << 16).unwrap();
        assert!(m.contains("unknown to this build (libslurm API 50)"), "{m}");
        assert!(m.contains("26.05.5"), "{m}");
        // A release the table does not know is never taken for a match.
        assert!(release_mismatch("x", 0x1b_05_00, 46 << 16).is_some());
    }

    #[test]
    fn nothing_to_check_outside_slurm() {
        assert!(release_ok(LOG, 0x01_02_03));
    }

    #[test]
    fn no_slurm_allocator_outside_slurm() {
        // Test binaries do not load libslurm: never fall back to another allocator.
        assert_eq!(xstrdup("x"), None);
        let mut field: *mut c_char = std::ptr::null_mut();
        assert_eq!(unsafe { set_field(&mut field, "v") }, Err(NoAllocator));
    }

    #[test]
    fn c_strings_and_arrays() {
        assert_eq!(c_string("a\0b").as_bytes(), b"a?b");
        let a = c_string("X=1");
        let b = c_string("Y=2");
        let arr = [
            a.as_ptr() as *mut c_char,
            std::ptr::null_mut(),
            b.as_ptr() as *mut c_char,
        ];
        let got = unsafe { string_array(arr.as_ptr(), 3) };
        assert_eq!(got, vec![b"X=1".as_slice(), b"Y=2".as_slice()]);
        assert!(unsafe { string_array(std::ptr::null(), 5) }.is_empty());
        assert_eq!(unsafe { bytes(std::ptr::null()) }, None);
    }
}
