//! sbatch loads spank_bftrainer.so for every job, so what the dynamic loader does at
//! dlopen is paid on every submission. These tests read the built .so and check that
//! nothing but weak symbols is looked up at load time (build.rs's lazy imports), that
//! the plugin is not linked for eager binding, and that every name in lazy-imports.txt
//! is a function import (a stub in front of data or TLS would break it).
//!
//! The plugin is a cdylib, so cargo does not build it for this test: `make test` builds
//! it first (`cargo build --workspace --all-targets`).

#![cfg(all(
    target_arch = "x86_64",
    target_pointer_width = "64",
    target_os = "linux",
    target_env = "gnu"
))]

use std::collections::BTreeMap;
use std::path::PathBuf;

use object::elf;
use object::read::elf::{Dyn, ElfFile64, FileHeader};
use object::{
    Object, ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget, SymbolKind,
};

// The plugin lookup (and its freshness check) shared with job_submit's cluster tests.
#[path = "../../job_submit/tests/support/mod.rs"]
mod support;

fn plugin() -> PathBuf {
    support::built_plugin("libspank_bftrainer.so")
}

/// The names in lazy-imports.txt (the format build.rs reads).
fn listed() -> Vec<&'static str> {
    include_str!("../lazy-imports.txt")
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect()
}

struct Imports {
    /// Symbols the loader resolves when the plugin is loaded (any dynamic relocation
    /// with a symbol other than a PLT slot), with whether the symbol is weak.
    at_load: Vec<(String, bool)>,
    /// Symbols behind PLT slots (bound on first call), with their symbol kind.
    plt: BTreeMap<String, SymbolKind>,
    bind_now: bool,
}

fn imports(data: &[u8]) -> Imports {
    let file = ElfFile64::<object::Endianness>::parse(data).expect("an ELF64 shared object");
    let dynsym = file.dynamic_symbol_table().expect("a dynamic symbol table");
    let mut at_load = Vec::new();
    let mut plt = BTreeMap::new();
    for (_, rel) in file.dynamic_relocations().expect("dynamic relocations") {
        let RelocationTarget::Symbol(idx) = rel.target() else {
            continue;
        };
        let sym = dynsym.symbol_by_index(idx).expect("relocation symbol");
        let name = sym.name().expect("symbol name").to_string();
        // PLT slots are resolved on first call under lazy binding; all else at load.
        if rel.flags()
            == (RelocationFlags::Elf {
                r_type: elf::R_X86_64_JUMP_SLOT,
            })
        {
            plt.insert(name, sym.kind());
        } else {
            at_load.push((name, sym.is_weak()));
        }
    }
    let endian = file.endian();
    let mut bind_now = false;
    if let Some((entries, _)) = file
        .elf_header()
        .sections(endian, data)
        .expect("section headers")
        .dynamic(endian, data)
        .expect("dynamic section")
    {
        for d in entries {
            let (tag, val) = (d.d_tag(endian) as u32, d.d_val(endian));
            bind_now |= tag == elf::DT_BIND_NOW
                || (tag == elf::DT_FLAGS && val & u64::from(elf::DF_BIND_NOW) != 0)
                || (tag == elf::DT_FLAGS_1 && val & u64::from(elf::DF_1_NOW) != 0);
        }
    }
    Imports {
        at_load,
        plt,
        bind_now,
    }
}

#[test]
fn only_weak_symbols_are_bound_when_the_plugin_loads() {
    let data = std::fs::read(plugin()).unwrap();
    let imp = imports(&data);
    let strong: Vec<&str> = imp
        .at_load
        .iter()
        .filter(|(_, weak)| !weak)
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        strong.is_empty(),
        "spank_bftrainer.so binds {strong:?} at dlopen (in every sbatch); add them to \
         plugin/spank/lazy-imports.txt"
    );
    assert!(
        !imp.bind_now,
        "spank_bftrainer.so is linked for eager binding (BIND_NOW); build.rs passes -z lazy"
    );
}

#[test]
fn every_listed_name_is_a_lazily_bound_function() {
    let data = std::fs::read(plugin()).unwrap();
    let imp = imports(&data);
    for name in listed() {
        // Each stub imports its name through the PLT, so every listed name is there.
        match imp.plt.get(name) {
            Some(SymbolKind::Text | SymbolKind::Unknown) => {}
            Some(kind) => panic!(
                "plugin/spank/lazy-imports.txt lists `{name}`, a {kind:?} symbol: only \
                 functions can sit behind a `jmp` stub; remove it"
            ),
            None => panic!(
                "`{name}` from plugin/spank/lazy-imports.txt is not a PLT import of \
                 spank_bftrainer.so: did build.rs's --wrap arguments apply?"
            ),
        }
    }
}
