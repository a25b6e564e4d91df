//! Slurm hostlist expressions (`gpu[001-064,100]`, `a[01-02]n[01-18]`, `cpu1,cpu2`) as
//! patterns a node name is matched against, never expanded: an expression names up to
//! billions of hosts with a few characters, and comes from a user's file.

use std::fmt;

/// One `[...]` item: a number from `lo` to `hi`, written with `width` digits (zero
/// padded) when the bound was written with leading zeros, else with no leading zero.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Set(Vec<Range>),
}

/// A parsed hostlist: host names matching any of its comma-separated patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostlist {
    patterns: Vec<Vec<Part>>,
}

/// Why a hostlist could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest expression read (a node list is a line of a config file).
const MAX_LEN: usize = 65_536;
/// Digits of a range bound: u64 holds 19.
const MAX_DIGITS: usize = 18;

impl Hostlist {
    pub fn parse(s: &str) -> Result<Hostlist, ParseError> {
        let err = |m: String| ParseError(format!("hostlist '{s}': {m}"));
        if s.len() > MAX_LEN {
            return Err(ParseError(format!(
                "hostlist of {} characters: at most {MAX_LEN} are read",
                s.len()
            )));
        }
        let mut patterns = Vec::new();
        let mut parts: Vec<Part> = Vec::new();
        let mut lit = String::new();
        let mut chars = s.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                ',' => {
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    if parts.is_empty() {
                        return Err(err(format!("empty host name at position {}", i + 1)));
                    }
                    patterns.push(std::mem::take(&mut parts));
                }
                '[' => {
                    let close = s[i..]
                        .find(']')
                        .map(|k| i + k)
                        .ok_or_else(|| err(format!("'[' at position {} is not closed", i + 1)))?;
                    let body = &s[i + 1..close];
                    if body.contains('[') {
                        return Err(err(format!("nested '[' after position {}", i + 1)));
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Set(ranges(body).map_err(err)?));
                    while chars.peek().is_some_and(|&(k, _)| k <= close) {
                        chars.next();
                    }
                }
                ']' => return Err(err(format!("']' at position {} without '['", i + 1))),
                c if c.is_whitespace() || c.is_control() => {
                    return Err(err(format!(
                        "{c:?} at position {} is not allowed in a host name",
                        i + 1
                    )))
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        if parts.is_empty() {
            return Err(err(if s.is_empty() {
                "empty".into()
            } else {
                "ends with ','".into()
            }));
        }
        patterns.push(parts);
        Ok(Hostlist { patterns })
    }

    /// Whether `name` is one of the hosts the expression names.
    pub fn contains(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| matches(p, name))
    }
}

/// The items of a `[...]`: `N`, `N-M`, comma-separated.
fn ranges(body: &str) -> Result<Vec<Range>, String> {
    let mut out = Vec::new();
    for item in body.split(',') {
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let num = |t: &str| -> Result<u64, String> {
            if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(format!(
                    "'[{body}]': '{item}' is not a number or a range N-M of numbers"
                ));
            }
            if t.len() > MAX_DIGITS {
                return Err(format!(
                    "'[{body}]': '{t}' has more than {MAX_DIGITS} digits"
                ));
            }
            Ok(t.parse().expect("digits"))
        };
        let (lo, hi) = (num(a)?, num(b)?);
        if lo > hi {
            return Err(format!("'[{body}]': range '{item}' runs backwards"));
        }
        // "01-18" pads to 2 digits; "1-18" does not pad; "08-10" pads to 2.
        let width = if a.len() > 1 && a.starts_with('0') {
            a.len()
        } else {
            0
        };
        out.push(Range { lo, hi, width });
    }
    Ok(out)
}

/// Whether `name` matches the pattern: the positions of `name` reachable after each
/// part, so that a pattern of many sets costs O(parts x length x digits), never the
/// exponential number of ways to cut a run of digits among its sets.
fn matches(parts: &[Part], name: &str) -> bool {
    let mut at = vec![false; name.len() + 1];
    at[0] = true;
    for part in parts {
        let mut next = vec![false; name.len() + 1];
        let mut any = false;
        for (pos, _) in at.iter().enumerate().filter(|(_, &r)| r) {
            let rest = &name[pos..];
            match part {
                Part::Lit(l) => {
                    if rest.starts_with(l.as_str()) {
                        next[pos + l.len()] = true;
                        any = true;
                    }
                }
                Part::Set(set) => {
                    // Every run of leading digits is a candidate number (a literal
                    // after the set may itself start with digits).
                    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                    for k in 1..=digits.min(MAX_DIGITS + 1) {
                        if in_set(set, &rest[..k]) {
                            next[pos + k] = true;
                            any = true;
                        }
                    }
                }
            }
        }
        if !any {
            return false;
        }
        at = next;
    }
    at[name.len()]
}

fn in_set(set: &[Range], d: &str) -> bool {
    let Ok(v) = d.parse::<u64>() else {
        return false;
    };
    set.iter().any(|r| {
        let written = if r.width > 0 {
            d.len() == r.width.max(digits_of(v))
        } else {
            d.len() == digits_of(v)
        };
        written && (r.lo..=r.hi).contains(&v)
    })
}

fn digits_of(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |l| l as usize + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Hostlist {
        Hostlist::parse(s).unwrap()
    }

    #[test]
    fn names_ranges_and_padding() {
        let a = h("a[01-36]n[01-18]");
        assert!(a.contains("a01n01"));
        assert!(a.contains("a36n18"));
        assert!(!a.contains("a37n01"));
        assert!(!a.contains("a1n01"), "padded to 2 digits");
        assert!(!a.contains("b01n01"));
        assert!(!a.contains("a01n01x"));
        let b = h("gpu[1-10,20],cpu7,login");
        assert!(b.contains("gpu1") && b.contains("gpu10") && b.contains("gpu20"));
        assert!(!b.contains("gpu01"), "not padded");
        assert!(!b.contains("gpu11"));
        assert!(b.contains("cpu7") && b.contains("login"));
        assert!(!b.contains("cpu"));
        // A literal after the set that starts with a digit.
        let c = h("n[1-3]0");
        assert!(c.contains("n10") && c.contains("n30"));
        assert!(!c.contains("n40"));
        // Padding wider than the values: 001..100.
        let d = h("x[001-100]");
        assert!(d.contains("x001") && d.contains("x100"));
        assert!(!d.contains("x1") && !d.contains("x0100"));
        // Billions of hosts cost nothing: nothing is expanded.
        assert!(h("n[0-999999999999]").contains("n123456789"));
        // Nor do many sets over a long run of digits (each cut tried once per position).
        let many = format!("n{}", "[0-999999999]".repeat(40));
        assert!(!h(&many).contains(&format!("n{}x", "1".repeat(60))));
        assert!(h(&many).contains(&format!("n{}", "12".repeat(40))));
    }

    #[test]
    fn bad_expressions_are_named() {
        let e = |s: &str| Hostlist::parse(s).unwrap_err().to_string();
        assert!(e("").contains("empty"));
        assert!(e("a[1-3").contains("not closed"), "{}", e("a[1-3"));
        assert!(e("a1-3]").contains("without '['"));
        assert!(e("a[3-1]").contains("runs backwards"));
        assert!(e("a[x]").contains("not a number"));
        assert!(e("a[-1]").contains("not a number"));
        assert!(e("a[1-2[3]]").contains("nested"));
        assert!(e("a,,b").contains("empty host name"));
        assert!(e("a,").contains("ends with ','"));
        assert!(e("a b").contains("not allowed"));
        assert!(e("a[1234567890123456789]").contains("digits"));
    }
}
