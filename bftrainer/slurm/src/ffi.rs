//! Small tools for the unsafe edge: copying C strings and sentinel values into owned
//! Rust values, RAII guards that free what libslurm allocated, hostlists and Lists.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_void};

use crate::error::{Error, Result};

/// Copies a C string; NULL and "" become `None`. Invalid UTF-8 is replaced, not fatal.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn opt_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: caller guarantees a valid NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    if s.is_empty() {
        None
    } else {
        Some(s.into_owned())
    }
}

/// Like [`opt_string`] but NULL becomes "".
///
/// # Safety
/// As for [`opt_string`].
pub(crate) unsafe fn string(p: *const c_char) -> String {
    // SAFETY: forwarded.
    unsafe { opt_string(p) }.unwrap_or_default()
}

/// Splits a comma-separated C string ("a,b,c") into its non-empty items.
///
/// # Safety
/// As for [`opt_string`].
pub(crate) unsafe fn comma_list(p: *const c_char) -> Vec<String> {
    // SAFETY: forwarded.
    match unsafe { opt_string(p) } {
        None => Vec::new(),
        Some(s) => s
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect(),
    }
}

/// A time_t where 0 means "not set".
pub(crate) fn opt_time(t: libc::time_t) -> Option<i64> {
    if t == 0 {
        None
    } else {
        Some(t)
    }
}

/// A u32 where NO_VAL (and INFINITE, where the field has no "unlimited" meaning)
/// means "not set".
pub(crate) fn opt_u32(v: u32) -> Option<u32> {
    if v == slurm_sys::NO_VAL || v == slurm_sys::INFINITE {
        None
    } else {
        Some(v)
    }
}

/// A u16 where NO_VAL16 / INFINITE16 means "not set".
pub(crate) fn opt_u16(v: u16) -> Option<u16> {
    if v == slurm_sys::NO_VAL16 as u16 || v == slurm_sys::INFINITE16 as u16 {
        None
    } else {
        Some(v)
    }
}

/// A u64 where NO_VAL64 / INFINITE64 means "not set".
pub(crate) fn opt_u64(v: u64) -> Option<u64> {
    if v == slurm_sys::NO_VAL64 || v == slurm_sys::INFINITE64 {
        None
    } else {
        Some(v)
    }
}

/// A CString for an argument, with an error that names the argument when it holds NUL.
pub(crate) fn c_arg(what: &'static str, s: &str) -> Result<CString> {
    CString::new(s)
        .map_err(|_| Error::invalid(what, "contains a NUL byte, which C strings cannot hold"))
}

/// `owned_msg!(Name, slurm_type, slurm_free_fn)`: a guard owning a `*mut slurm_type`
/// that libslurm allocated (NULL until the call fills it), freed once on drop with
/// the matching `slurm_free_*`, on every return path and on unwinding.
macro_rules! owned_msg {
    ($(#[$doc:meta])* $name:ident, $ty:ident, $free:ident) => {
        $(#[$doc])*
        struct $name(*mut slurm_sys::$ty);

        impl Drop for $name {
            fn drop(&mut self) {
                if !self.0.is_null() {
                    // SAFETY: allocated by libslurm for this guard, freed only here.
                    unsafe { slurm_sys::$free(self.0) };
                }
            }
        }
    };
}
pub(crate) use owned_msg;

/// Owns a hostlist_t; destroyed on drop.
struct Hostlist(slurm_sys::compat::Hostlist);

impl Drop for Hostlist {
    fn drop(&mut self) {
        // SAFETY: created by slurm_hostlist_create, destroyed once.
        unsafe { slurm_sys::slurm_hostlist_destroy(self.0) };
    }
}

/// Expands a Slurm host expression ("n[1-3],x7") into names, in Slurm's order.
pub fn hostlist_expand(expr: &str) -> Result<Vec<String>> {
    let expr = expr.trim();
    if expr.is_empty() {
        return Ok(Vec::new());
    }
    check_brackets(expr)?;
    let c = c_arg("host list", expr)?;
    // SAFETY: c is a valid C string for the call; the result is owned by the guard.
    let hl = unsafe { slurm_sys::slurm_hostlist_create(c.as_ptr()) };
    if hl.is_null() {
        return Err(Error::invalid(
            "host list",
            format!("`{expr}` is not a Slurm host expression (e.g. n[1-4],gpu7)"),
        ));
    }
    let hl = Hostlist(hl);
    let mut out = Vec::new();
    loop {
        // SAFETY: hl is live; shift returns a malloc'd string (hostlist.c uses
        // malloc/strdup there), so it is released with libc free.
        let p = unsafe { slurm_sys::slurm_hostlist_shift(hl.0) };
        if p.is_null() {
            break;
        }
        // SAFETY: p is a valid C string until freed below.
        out.push(unsafe { string(p) });
        // SAFETY: p came from malloc inside libslurm.
        unsafe { libc::free(p.cast()) };
    }
    Ok(out)
}

/// Checks what Slurm's parser gets wrong or reports badly: unbalanced brackets
/// ("n[3-" would become the host "n]") and ranges such as "[5-2]" (refused by Slurm
/// with a message on stderr and a leaked string, so we refuse them first).
fn check_brackets(expr: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid(
            "host list",
            format!("`{expr}`: {why} (e.g. n[1-4,7],gpu7)"),
        ))
    };
    let mut rest = expr;
    while let Some(open) = rest.find(['[', ']']) {
        if rest.as_bytes()[open] == b']' {
            return bad("`]` without `[`");
        }
        let Some(len) = rest[open + 1..].find(['[', ']']) else {
            return bad("`[` without `]`");
        };
        let inner = &rest[open + 1..open + 1 + len];
        if rest.as_bytes()[open + 1 + len] == b'[' {
            return bad("nested `[`");
        }
        for item in inner.split(',') {
            let (lo, hi) = item.split_once('-').unwrap_or((item, item));
            let (Ok(l), Ok(h)) = (lo.parse::<u64>(), hi.parse::<u64>()) else {
                return bad(&format!("`{item}` is not a number or a range lo-hi"));
            };
            if l > h {
                return bad(&format!("range `{item}` runs backwards"));
            }
        }
        rest = &rest[open + 2 + len..];
    }
    Ok(())
}

/// Compresses host names into Slurm's ranged form ("n[1-3]").
pub fn hostlist_compress<S: AsRef<str>>(names: &[S]) -> Result<String> {
    let joined = names
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(",");
    if joined.is_empty() {
        return Ok(String::new());
    }
    let c = c_arg("host list", &joined)?;
    // SAFETY: as in hostlist_expand.
    let hl = unsafe { slurm_sys::slurm_hostlist_create(c.as_ptr()) };
    if hl.is_null() {
        return Err(Error::invalid(
            "host list",
            format!("cannot parse `{joined}`"),
        ));
    }
    let hl = Hostlist(hl);
    // SAFETY: the result is xmalloc'd (documented in slurm.h) and freed with xfree.
    let p = unsafe { slurm_sys::slurm_hostlist_ranged_string_xmalloc(hl.0) };
    let out = XString(p);
    // SAFETY: p is NULL or a valid C string owned by `out`.
    Ok(unsafe { string(out.0) })
}

/// Owns an xmalloc'd C string; freed with xfree on drop.
pub(crate) struct XString(pub(crate) *mut c_char);

impl Drop for XString {
    fn drop(&mut self) {
        if !self.0.is_null() {
            let mut p = self.0.cast::<c_void>();
            // SAFETY: the pointer came from Slurm's allocator and is freed once.
            unsafe { slurm_sys::slurm_xfree(&mut p) };
        }
    }
}

/// Owns a Slurm `List`; destroyed (with its items, via the List's destructor) on drop.
pub(crate) struct List(pub(crate) slurm_sys::compat::List);

impl List {
    /// A new list whose items are xmalloc'd and freed with xfree.
    pub(crate) fn new_xfree() -> List {
        // SAFETY: creating a list has no preconditions.
        List(unsafe { slurm_sys::slurm_list_create(Some(slurm_sys::slurm_xfree_ptr)) })
    }

    /// Appends an xstrdup'd copy of `s`.
    pub(crate) fn push_str(&mut self, what: &'static str, s: &str) -> Result<()> {
        let c = c_arg(what, s)?;
        // SAFETY: xstrdup copies into Slurm's allocator; the list frees it with xfree.
        unsafe {
            let p = slurm_sys::slurm_xstrdup(c.as_ptr());
            slurm_sys::slurm_list_append(self.0, p.cast());
        }
        Ok(())
    }

    /// Calls `f` on every item pointer in order.
    pub(crate) fn for_each(&self, mut f: impl FnMut(*mut c_void)) {
        if self.0.is_null() {
            return;
        }
        // SAFETY: the list is live for the whole iteration; the iterator is destroyed
        // before we return.
        unsafe {
            let it = slurm_sys::slurm_list_iterator_create(self.0);
            loop {
                let item = slurm_sys::slurm_list_next(it);
                if item.is_null() {
                    break;
                }
                f(item);
            }
            slurm_sys::slurm_list_iterator_destroy(it);
        }
    }
}

impl Drop for List {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: owned list, destroyed once.
            unsafe { slurm_sys::slurm_list_destroy(self.0) };
        }
    }
}

/// Calls `f` on each item of a List we do not own (e.g. a field of a response).
///
/// # Safety
/// `l` is NULL or a live List for the duration of the call.
pub(crate) unsafe fn for_each_borrowed(l: slurm_sys::compat::List, f: impl FnMut(*mut c_void)) {
    // ManuallyDrop, not mem::forget after the loop: if `f` panics, unwinding must not
    // destroy a list that its owner (a Slurm response) frees again later.
    let borrowed = std::mem::ManuallyDrop::new(List(l));
    borrowed.for_each(f);
}

/// Resolves a uid to a user name with getpwuid_r (thread-safe), `None` if unknown.
pub(crate) fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: buffers are valid and sized; result is only read when non-NULL.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: pw_name points into buf, valid here.
    unsafe { opt_string(pwd.pw_name) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_map_to_none() {
        assert_eq!(opt_u32(slurm_sys::NO_VAL), None);
        assert_eq!(opt_u32(slurm_sys::INFINITE), None);
        assert_eq!(opt_u32(7), Some(7));
        assert_eq!(opt_u16(slurm_sys::NO_VAL16 as u16), None);
        assert_eq!(opt_u64(slurm_sys::NO_VAL64), None);
        assert_eq!(opt_time(0), None);
        assert_eq!(opt_time(5), Some(5));
    }

    #[test]
    fn null_and_empty_strings_are_none() {
        unsafe {
            assert_eq!(opt_string(std::ptr::null()), None);
            assert_eq!(opt_string(c"".as_ptr()), None);
            assert_eq!(opt_string(c"x".as_ptr()), Some("x".into()));
            assert_eq!(comma_list(std::ptr::null()), Vec::<String>::new());
            assert_eq!(comma_list(c"a,,b".as_ptr()), vec!["a", "b"]);
        }
    }

    #[test]
    fn hostlists_round_trip() {
        let v = hostlist_expand("n[1-3],gpu7").unwrap();
        assert_eq!(v, vec!["n1", "n2", "n3", "gpu7"]);
        assert_eq!(hostlist_compress(&v).unwrap(), "n[1-3],gpu7");
        assert!(hostlist_expand("").unwrap().is_empty());
        assert!(hostlist_expand("n[3-").is_err());
        assert!(hostlist_expand("n]").is_err());
        assert!(hostlist_expand("n[5-2]").is_err());
        assert!(hostlist_expand("n[1-x]").is_err());
        assert!(hostlist_expand("n[[1]]").is_err());
        assert_eq!(
            hostlist_expand("n[1-2,5],m[07-08]").unwrap(),
            ["n1", "n2", "n5", "m07", "m08"]
        );
        assert!(hostlist_expand("a\0b").is_err());
    }

    #[test]
    fn slurm_lists_free_their_items() {
        let mut l = List::new_xfree();
        l.push_str("x", "one").unwrap();
        l.push_str("x", "two").unwrap();
        let mut seen = Vec::new();
        l.for_each(|p| seen.push(unsafe { string(p.cast()) }));
        assert_eq!(seen, vec!["one", "two"]);
    }

    #[test]
    fn a_panic_while_walking_a_borrowed_list_leaves_it_to_its_owner() {
        let mut owner = List::new_xfree();
        owner.push_str("x", "one").unwrap();
        owner.push_str("x", "two").unwrap();
        let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            for_each_borrowed(owner.0, |_| panic!("deliberate"));
        }));
        assert!(walked.is_err());
        // Still intact (a destroyed list would be a use after free here, and a double
        // free when `owner` drops).
        let mut seen = Vec::new();
        unsafe { for_each_borrowed(owner.0, |p| seen.push(string(p.cast()))) };
        assert_eq!(seen, vec!["one", "two"]);
    }

    #[test]
    fn root_has_a_name() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
    }
}
