//! Slurm's `--constraint` expressions, read per node: whether a node's features could
//! serve a job. `&` (or `,`) is AND, `|` is OR, `(...)` groups, `[...]` is Slurm's
//! matching OR (every node the same alternative; per node it is an OR), and a count
//! `FEATURE*N` needs FEATURE on the node. Per node this is a necessary condition:
//! Slurm still decides, for instance that a matching OR takes one alternative for all.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    Feature(String),
    All(Vec<Constraint>),
    Any(Vec<Constraint>),
}

/// Why an expression could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

const SPECIAL: &[char] = &['&', '|', ',', '(', ')', '[', ']', '*'];

/// Deepest nesting of `(...)`/`[...]` read: the expression comes from a user's job, and
/// a recursive reader must not let one exhaust the daemon's stack.
const MAX_DEPTH: usize = 32;

struct Parser<'a> {
    s: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn err(&self, what: &str) -> ParseError {
        ParseError(format!(
            "constraint '{}': {what} at position {}",
            self.s,
            self.pos + 1
        ))
    }

    fn expr(&mut self) -> Result<Constraint, ParseError> {
        let mut alts = vec![self.term()?];
        while self.peek() == Some('|') {
            self.pos += 1;
            alts.push(self.term()?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap()
        } else {
            Constraint::Any(alts)
        })
    }

    fn term(&mut self) -> Result<Constraint, ParseError> {
        let mut all = vec![self.factor()?];
        while matches!(self.peek(), Some('&') | Some(',')) {
            self.pos += 1;
            all.push(self.factor()?);
        }
        Ok(if all.len() == 1 {
            all.pop().unwrap()
        } else {
            Constraint::All(all)
        })
    }

    fn factor(&mut self) -> Result<Constraint, ParseError> {
        let c = match self.peek() {
            Some(open @ ('(' | '[')) => {
                if self.depth >= MAX_DEPTH {
                    return Err(self.err(&format!("nested deeper than {MAX_DEPTH} groups")));
                }
                self.pos += 1;
                self.depth += 1;
                let inner = self.expr()?;
                self.depth -= 1;
                let close = if open == '(' { ')' } else { ']' };
                if self.peek() != Some(close) {
                    return Err(self.err(&format!("expected '{close}'")));
                }
                self.pos += 1;
                inner
            }
            Some(c) if !SPECIAL.contains(&c) && !c.is_whitespace() => {
                let start = self.pos;
                while let Some(c) = self.peek() {
                    if SPECIAL.contains(&c) || c.is_whitespace() {
                        break;
                    }
                    self.pos += c.len_utf8();
                }
                Constraint::Feature(self.s[start..self.pos].to_string())
            }
            _ => return Err(self.err("expected a feature name, '(' or '['")),
        };
        if self.peek() == Some('*') {
            self.pos += 1;
            let start = self.pos;
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
            if start == self.pos {
                return Err(self.err("expected a count after '*'"));
            }
        }
        Ok(c)
    }
}

impl Constraint {
    /// Reads a `--constraint` expression.
    pub fn parse(s: &str) -> Result<Constraint, ParseError> {
        let mut p = Parser {
            s: s.trim(),
            pos: 0,
            depth: 0,
        };
        let c = p.expr()?;
        if p.pos != p.s.len() {
            return Err(p.err("unexpected character"));
        }
        Ok(c)
    }

    /// Whether a node with these features could serve the job.
    pub fn matches<S: AsRef<str>>(&self, features: &[S]) -> bool {
        match self {
            Constraint::Feature(f) => features.iter().any(|x| x.as_ref() == f),
            Constraint::All(v) => v.iter().all(|c| c.matches(features)),
            Constraint::Any(v) => v.iter().any(|c| c.matches(features)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(expr: &str, features: &[&str]) -> bool {
        Constraint::parse(expr).unwrap().matches(features)
    }

    #[test]
    fn and_or_groups_counts() {
        assert!(m("gpu", &["gpu", "a100"]));
        assert!(!m("gpu", &["cpu"]));
        assert!(m("gpu&a100", &["gpu", "a100"]));
        assert!(!m("gpu&a100", &["gpu", "v100"]));
        assert!(m("gpu,a100", &["a100", "gpu"]));
        assert!(m("a100|v100", &["v100"]));
        assert!(m("(a100|v100)&ib", &["v100", "ib"]));
        assert!(!m("(a100|v100)&ib", &["v100"]));
        assert!(m("[rack1|rack2]", &["rack2"]));
        assert!(m("[rack1*2&rack2*4]", &["rack1", "rack2"]));
        assert!(m("mem=large", &["mem=large"]));
        // & binds tighter than |.
        assert!(m("a|b&c", &["a"]));
        assert!(!m("a|b&c", &["b"]));
    }

    #[test]
    fn bad_expressions_say_where() {
        for (e, want) in [
            ("", "expected a feature name"),
            ("gpu&", "expected a feature name, '(' or '[' at position 5"),
            ("(gpu", "expected ')'"),
            ("[gpu)", "expected ']'"),
            ("gpu*", "expected a count after '*'"),
            ("gpu)", "unexpected character at position 4"),
        ] {
            let err = Constraint::parse(e).unwrap_err().0;
            assert!(err.contains(want), "{e:?}: {err}");
        }
        // A user's job writes it: deep nesting is refused, not recursed into.
        let deep = format!("{}gpu{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(Constraint::parse(&deep)
            .unwrap_err()
            .0
            .contains("nested deeper than 32 groups"));
        assert!(Constraint::parse(&format!("{}gpu{}", "(".repeat(32), ")".repeat(32))).is_ok());
    }
}
