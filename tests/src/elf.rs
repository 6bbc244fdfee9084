//! Reads a built binary's ELF symbol table: where the uprobe hook symbols
//! are, what kind of symbols they are, and the bytes they start with.

use object::elf;
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection, ObjectSymbol};

/// One symbol of the static symbol table (`.symtab`), as a uprobe tool sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfSymbol {
    /// Symbol name.
    pub name: String,
    /// `st_value`: the virtual address.
    pub address: u64,
    /// `st_size`.
    pub size: u64,
    /// `st_type == STT_FUNC`.
    pub is_func: bool,
    /// `st_bind == STB_GLOBAL`.
    pub is_global: bool,
    /// Name of the section it is defined in (empty when undefined).
    pub section: String,
    /// File offset of `address` (what a uprobe is attached at).
    pub file_offset: Option<u64>,
    /// Up to 16 bytes at `address`, read from the file.
    pub head: Vec<u8>,
}

/// Every definition of each name in `names` in the static symbol table of
/// the ELF file at `path` (index-aligned with `names`).
pub fn symbols(path: &std::path::Path, names: &[&str]) -> Result<Vec<Vec<ElfSymbol>>, String> {
    let data = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let file =
        ElfFile64::<Endianness>::parse(&*data).map_err(|e| format!("parse {}: {e}", path.display()))?;
    let mut found = vec![Vec::new(); names.len()];
    for symbol in file.symbols() {
        let Ok(name) = symbol.name() else { continue };
        let Some(slot) = names.iter().position(|n| *n == name) else {
            continue;
        };
        let raw = symbol.elf_symbol();
        let address = symbol.address();
        let (section, file_offset, head) = match symbol.section_index() {
            Some(index) => {
                let section = file.section_by_index(index).map_err(|e| e.to_string())?;
                let section_name = section.name().unwrap_or("?").to_owned();
                let bytes = section.data().map_err(|e| e.to_string())?;
                let offset = address.checked_sub(section.address());
                let head = offset
                    .and_then(|o| bytes.get(o as usize..))
                    .map(|b| b[..b.len().min(16)].to_vec())
                    .unwrap_or_default();
                let file_offset = match (offset, section.file_range()) {
                    (Some(o), Some((start, _))) => Some(start + o),
                    _ => None,
                };
                (section_name, file_offset, head)
            }
            None => (String::new(), None, Vec::new()),
        };
        found[slot].push(ElfSymbol {
            name: name.to_owned(),
            address,
            size: symbol.size(),
            is_func: raw.st_type() == elf::STT_FUNC,
            is_global: raw.st_bind() == elf::STB_GLOBAL,
            section,
            file_offset,
            head,
        });
    }
    Ok(found)
}

/// x86 legacy prefixes that may precede an opcode, LOCK (0xF0) among them.
const LEGACY_PREFIXES: [u8; 11] = [0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0x66, 0x67];

/// Whether the x86 instruction at the start of `code` carries a LOCK
/// prefix (which uprobes cannot single-step). Looks through the whole run
/// of legacy prefixes, since LOCK need not come first.
pub fn starts_with_lock_prefix(code: &[u8]) -> bool {
    code.iter()
        .take_while(|b| LEGACY_PREFIXES.contains(b))
        .any(|&b| b == 0xF0)
}
