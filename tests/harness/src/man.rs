//! The commands' man pages (docs/man/NAME.S, installed by scripts/make-deb): NAME,
//! SYNOPSIS, OPTIONS, COMMANDS and EXAMPLES come from the command's own clap definition
//! (clap_mangen), the rest from a hand-written part (docs/man/src/NAME.S). A unit test in
//! each binary calls [`check`], so a page cannot fall behind its command's options:
//! `BFT_UPDATE_MAN=1 cargo test ... man_page` rewrites it.

use std::path::{Path, PathBuf};

/// In a hand-written part, the line after which the generated OPTIONS, COMMANDS and
/// EXAMPLES go: what comes before it (DESCRIPTION) follows the SYNOPSIS, the rest (EXIT
/// STATUS, FILES, SIGNALS, SEE ALSO...) follows them.
pub const OPTIONS_MARK: &str = ".\\\" @OPTIONS@";

/// The repository's docs/man.
pub fn man_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/man")
}

fn render(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    f(&mut out).expect("rendering to memory");
    String::from_utf8(out).expect("clap_mangen writes UTF-8")
}

/// Drops a rendered section's `.SH` line (or turns an options heading into a
/// paragraph), so that the section's body can sit under a subcommand's `.SS`.
fn body(section: &str) -> String {
    let mut out = String::new();
    for line in section.lines() {
        match line.strip_prefix(".SH ") {
            Some("OPTIONS" | "SYNOPSIS" | "DESCRIPTION") => {}
            Some(heading) => out.push_str(&format!(".PP\n\\fI{heading}\\fR\n")),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The whole page of `cmd` in `section`, with the hand-written part `hand`.
pub fn page(mut cmd: clap::Command, section: &str, hand: &str) -> String {
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone())
        .section(section)
        .manual("BFTrainer for Slurm");
    let (before, after) = hand.split_once(OPTIONS_MARK).unwrap_or(("", hand));
    let mut out = String::new();
    out.push_str(
        ".\\\" Generated from the command's clap definition and docs/man/src/: do not edit\n",
    );
    out.push_str(
        ".\\\" (BFT_UPDATE_MAN=1 cargo test ... man_page rewrites it; tests/harness/src/man.rs).\n",
    );
    out.push_str(&render(|w| man.render_title(w)));
    out.push_str(&render(|w| man.render_name_section(w)));
    out.push_str(&render(|w| man.render_synopsis_section(w)));
    if before.trim().is_empty() {
        out.push_str(&render(|w| man.render_description_section(w)));
    } else {
        out.push_str(before.trim_start_matches('\n'));
    }
    out.push_str(&render(|w| man.render_options_section(w)));
    // clap's own `help` subcommand is what --help says already.
    let subs: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        out.push_str(".SH COMMANDS\n");
        for sub in subs {
            let name = sub.get_bin_name().unwrap_or(sub.get_name()).to_string();
            let m = clap_mangen::Man::new(sub.clone());
            out.push_str(&format!(".SS \"{name}\"\n"));
            out.push_str(&body(&render(|w| m.render_synopsis_section(w))));
            out.push_str(".PP\n");
            out.push_str(&body(&render(|w| m.render_description_section(w))));
            out.push_str(&body(&render(|w| m.render_options_section(w))));
        }
    }
    if let Some(examples) = cmd.get_after_help() {
        out.push_str(".SH EXAMPLES\n.nf\n");
        for line in examples.to_string().lines() {
            out.push_str(&roff_line(line));
            out.push('\n');
        }
        out.push_str(".fi\n");
    }
    out.push_str(after.trim_start_matches('\n'));
    if !out.ends_with('\n') {
        out.push('\n');
    }
    // clap_mangen defines the apostrophe string at the top of each rendered piece:
    // once is enough.
    let mut defined = (false, false);
    out.lines()
        .filter(|l| match *l {
            ".ie \\n(.g .ds Aq \\(aq" => !std::mem::replace(&mut defined.0, true),
            ".el .ds Aq '" => !std::mem::replace(&mut defined.1, true),
            _ => true,
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A line of plain text in roff: backslashes doubled, a leading `.` or `'` escaped,
/// `-` as a minus (what a reader types).
fn roff_line(line: &str) -> String {
    let s = line.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// Fails unless docs/man/`name`.`section` is the page [`page`] makes now from `cmd` and
/// docs/man/src/`name`.`section`; with `BFT_UPDATE_MAN` set, writes it instead.
pub fn check(cmd: clap::Command, section: &str, name: &str) {
    let file = format!("{name}.{section}");
    let dir = man_dir();
    let hand = std::fs::read_to_string(dir.join("src").join(&file))
        .unwrap_or_else(|e| panic!("docs/man/src/{file}: {e}"));
    let want = page(cmd, section, &hand);
    let path = dir.join(&file);
    if std::env::var_os("BFT_UPDATE_MAN").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("docs/man/{file}: {e}"));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let (n, (h, w)) = have
            .lines()
            .chain(std::iter::repeat(""))
            .zip(want.lines().chain(std::iter::repeat("")))
            .enumerate()
            .find(|(_, (h, w))| h != w)
            .unwrap_or((0, ("", "")));
        panic!(
            "docs/man/{file} is out of date with {name}'s options or docs/man/src/{file} \
             (line {}: has {h:?}, should be {w:?}); regenerate it with \
             `BFT_UPDATE_MAN=1 cargo test -p <crate> man_page` and commit it",
            n + 1
        );
    }
}
