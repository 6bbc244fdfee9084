//! The four uprobe attach points are real, distinct, probe-able functions
//! in binaries that link subetha-core: the `subetha-child` helper (an
//! ordinary application) and this test executable.

use std::path::Path;

use subetha_core::hooks::HOOK_SYMBOLS;
use subetha_tests::elf::{self, ElfSymbol};

const EXPECTED: [&str; 4] = [
    "subetha_drop_begin",
    "subetha_drop_end",
    "subetha_scan_begin",
    "subetha_scan_end",
];

/// `nopl 0x0(%rax,%rax,1)`.
#[cfg(target_arch = "x86_64")]
const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

fn check_hooks(path: &Path) {
    let found = elf::symbols(path, &EXPECTED).unwrap_or_else(|e| panic!("{e}"));
    let mut hooks: Vec<&ElfSymbol> = Vec::new();
    for (name, definitions) in EXPECTED.iter().zip(&found) {
        assert_eq!(
            definitions.len(),
            1,
            "{}: expected exactly one symbol {name}, found {definitions:#?}",
            path.display()
        );
        let sym = &definitions[0];
        assert!(sym.is_func, "{}: {name} is not STT_FUNC: {sym:?}", path.display());
        assert!(
            sym.is_global,
            "{}: {name} is not STB_GLOBAL: {sym:?}",
            path.display()
        );
        assert_ne!(sym.address, 0, "{}: {name} is undefined: {sym:?}", path.display());
        assert!(sym.size > 0, "{}: {name} has size 0: {sym:?}", path.display());
        assert_eq!(
            sym.section,
            ".text",
            "{}: {name} not in .text: {sym:?}",
            path.display()
        );
        assert!(
            sym.file_offset.is_some(),
            "{}: {name} has no file offset: {sym:?}",
            path.display()
        );
        assert!(
            !sym.head.is_empty(),
            "{}: no bytes read at {name}: {sym:?}",
            path.display()
        );
        assert!(
            !elf::starts_with_lock_prefix(&sym.head),
            "{}: {name} starts with a LOCK-prefixed instruction (uprobes cannot single-step it): {:02x?}",
            path.display(),
            sym.head
        );
        // The kernel (6.18+) optimises a uprobe on a 5-byte NOP into a
        // trampoline call; the probes attach at the symbol address.
        #[cfg(target_arch = "x86_64")]
        assert!(
            sym.head.starts_with(&NOP5),
            "{}: {name} does not start with the 5-byte NOP 0f 1f 44 00 00: {:02x?}",
            path.display(),
            sym.head
        );
        hooks.push(sym);
    }
    let mut addresses: Vec<u64> = hooks.iter().map(|s| s.address).collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(
        addresses.len(),
        4,
        "{}: hook bodies were merged (shared addresses): {hooks:#?}",
        path.display()
    );
}

#[test]
fn library_names_the_four_hooks() {
    assert_eq!(HOOK_SYMBOLS, EXPECTED);
}

#[test]
fn helper_application_exports_four_distinct_probeable_hooks() {
    check_hooks(Path::new(env!("CARGO_BIN_EXE_subetha-child")));
}

#[test]
fn test_executable_exports_four_distinct_probeable_hooks() {
    // Use the library the way an instrumented application does (register,
    // observe, in-process sidecar), so the linker keeps what such an
    // application keeps. Only reachable code survives `--gc-sections`: a
    // binary that never drains has no reason to carry the scan hooks.
    let instance = subetha_core::Instance::register(subetha_core::InstanceKind::CUSTOM, "hooks").unwrap();
    assert!(instance.observe(1, 0, 0).unwrap());
    check_hooks(&std::env::current_exe().expect("current_exe"));
}

#[test]
fn lock_prefix_detection_is_not_vacuous() {
    // `lock xadd [rdi], eax`, also behind an operand-size prefix.
    assert!(elf::starts_with_lock_prefix(&[0xF0, 0x0F, 0xC1, 0x07]));
    assert!(elf::starts_with_lock_prefix(&[0x66, 0xF0, 0x0F, 0xC1, 0x07]));
    // `ret`, and `push rbp`.
    assert!(!elf::starts_with_lock_prefix(&[0xC3]));
    assert!(!elf::starts_with_lock_prefix(&[0x55, 0xF0]));
}
