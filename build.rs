//! Generates the raw Slurm FFI from the headers installed on this machine.
//! Also exports SLURM_VERSION_NUMBER and turns `#define X SLURM_BIT(n)` into consts.
//! API differences between Slurm releases become `slurm_ge_MAJOR_MINOR` cfgs, set here
//! and passed to dependents (DEP_SLURM_CFGS / DEP_SLURM_ALL_CFGS) through `links`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const HEADERS: [&str; 3] = ["slurm/slurm.h", "slurm/slurmdb.h", "slurm/spank.h"];
/// Releases that changed an API this project uses; each gives the cfg
/// `slurm_ge_MAJOR_MINOR`, set when the headers are that release or newer (what changed
/// in each: `compat` in src/lib.rs and docs/admin.md).
const RELEASE_CFGS: [(u32, u32); 7] = [
    (23, 2),
    (23, 11),
    (24, 5),
    (24, 11),
    (25, 5),
    (25, 11),
    (26, 5),
];
const PACKAGE_HINT: &str =
    "install the Debian package `libslurm-dev` (apt-get install libslurm-dev), \
     or set SLURM_INCLUDE_DIR to the directory that contains slurm/slurm.h";

fn include_dir() -> PathBuf {
    if let Ok(dir) = env::var("SLURM_INCLUDE_DIR") {
        return PathBuf::from(dir);
    }
    PathBuf::from("/usr/include")
}

fn main() {
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=SLURM_LIB_DIR");
    let inc = include_dir();
    for h in HEADERS {
        let p = inc.join(h);
        if !p.is_file() {
            panic!(
                "slurm-sys: Slurm header {} not found; {}",
                p.display(),
                PACKAGE_HINT
            );
        }
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let version = read_version(&inc.join("slurm/slurm_version.h"));
    println!("cargo:rustc-env=SLURM_VERSION_NUMBER={version}");
    println!("cargo:version_number={version}");
    let (mut all, mut active) = (Vec::new(), Vec::new());
    for (major, minor) in RELEASE_CFGS {
        let name = format!("slurm_ge_{major}_{minor:02}");
        println!("cargo::rustc-check-cfg=cfg({name})");
        if version >= (major << 16 | minor << 8) {
            println!("cargo:rustc-cfg={name}");
            active.push(name.clone());
        }
        all.push(name);
    }
    // For dependents' build scripts: DEP_SLURM_CFGS (set) and DEP_SLURM_ALL_CFGS (known,
    // for their check-cfg), so a plugin's FFI agrees with slurm-sys on every release.
    println!("cargo:cfgs={}", active.join(","));
    println!("cargo:all_cfgs={}", all.join(","));

    let wrapper = "#include <stdint.h>\n#include <stdbool.h>\n#include <slurm/slurm.h>\n\
                   #include <slurm/slurmdb.h>\n#include <slurm/spank.h>\n";
    // Allow-list by file: everything the public Slurm headers declare (functions, types,
    // object-like macros), plus the libc types they use, and nothing else from libc.
    let public = format!(
        "{}/slurm/(slurm|slurmdb|spank|slurm_errno|slurm_version)\\.h",
        regex_escape(&inc.display().to_string())
    );
    let bindings = bindgen::Builder::default()
        .header_contents("slurm_wrapper.h", wrapper)
        .clang_arg(format!("-I{}", inc.display()))
        .allowlist_file(&public)
        // Not public API: declared by hand in src/lib.rs with each release's signatures.
        .blocklist_function("slurm_xcalloc|slurm_xfree|slurm_xfree_ptr|slurm_xstrdup|slurm_job_reason_string|slurm_job_state_reason_string|slurm_job_state_string|slurm_node_state_string_complete")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .parse_callbacks(Box::new(MacroTypes))
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "slurm-sys: bindgen failed on the Slurm headers in {}: {e}; {}",
                inc.display(),
                PACKAGE_HINT
            )
        });

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("slurm-sys: cannot write bindings.rs");

    // bindgen cannot evaluate function-like macros, so SLURM_BIT(n) flags (node state
    // flags such as PLANNED and DRAIN, job state flags, show flags...) are lost. Derive
    // them from the header text so they always match the installed Slurm.
    let mut bits =
        String::from("// Generated from `#define NAME SLURM_BIT(n)` lines in the Slurm headers.\n");
    for h in ["slurm/slurm.h", "slurm/slurmdb.h"] {
        let text = fs::read_to_string(inc.join(h)).expect("read header");
        for (name, bit) in slurm_bit_defines(&text) {
            bits.push_str(&format!("pub const {name}: u64 = 1u64 << {bit};\n"));
        }
    }
    fs::write(out.join("slurm_bits.rs"), bits).expect("write slurm_bits.rs");

    if env::var_os("CARGO_FEATURE_LINK").is_some() {
        if let Ok(dir) = env::var("SLURM_LIB_DIR") {
            println!("cargo:rustc-link-search=native={dir}");
        }
        println!("cargo:rustc-link-lib=dylib=slurm");
    }
}

/// bindgen sees `#define NO_VAL64 (0xfffffffffffffffe)` as the i64 -2 and would emit
/// `i32 = -2`. C gives such a literal an unsigned 64-bit type; so do we, for every
/// macro whose value does not fit i32 (negative values that C spells with a minus
/// sign, like SLURM_ERROR, stay signed: they are small).
#[derive(Debug)]
struct MacroTypes;

impl bindgen::callbacks::ParseCallbacks for MacroTypes {
    fn int_macro(&self, name: &str, value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        // The *64 sentinels (NO_VAL64, INFINITE64, NO_CONSUME_VAL64) arrive wrapped
        // to small negative numbers, so the name is the only reliable sign.
        if name.ends_with("64") || value < i64::from(i32::MIN) || value > i64::from(u32::MAX) {
            Some(IntKind::U64)
        } else {
            None
        }
    }
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn read_version(path: &Path) -> u32 {
    let text = fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "slurm-sys: cannot read {}: {e}; {}",
            path.display(),
            PACKAGE_HINT
        )
    });
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() == Some("#define") && it.next() == Some("SLURM_VERSION_NUMBER") {
            let v = it.next().expect("SLURM_VERSION_NUMBER value");
            let v = v.trim_start_matches("0x").trim_start_matches("0X");
            return u32::from_str_radix(v, 16).expect("SLURM_VERSION_NUMBER is hex");
        }
    }
    panic!("slurm-sys: no SLURM_VERSION_NUMBER in {}", path.display());
}

/// `#define NODE_STATE_DRAIN SLURM_BIT(9) /* ... */` -> ("NODE_STATE_DRAIN", 9).
fn slurm_bit_defines(text: &str) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(val)) = (it.next(), it.next()) else {
            continue;
        };
        if name.contains('(') {
            continue;
        }
        if let Some(n) = val
            .strip_prefix("SLURM_BIT(")
            .and_then(|v| v.strip_suffix(')'))
        {
            if let Ok(bit) = n.trim().parse::<u32>() {
                out.push((name.to_string(), bit));
            }
        }
    }
    out
}
