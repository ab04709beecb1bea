use super::*;
use std::os::unix::fs::OpenOptionsExt as _;

#[test]
fn a_version_is_read_at_the_start_of_a_text() {
    assert_eq!(Version::at_start_of("2.28.3+cuda13.0"), Some(Version(2, 28, 3)));
    assert_eq!(Version::at_start_of("2.5.6"), Some(Version(2, 5, 6)));
    assert_eq!(Version::at_start_of("2.30.7-1 rest"), Some(Version(2, 30, 7)));
    assert_eq!(Version::at_start_of("2.x.3"), None);
    assert_eq!(Version::at_start_of("2.28"), None);
    assert_eq!(Version::at_start_of("mismatch"), None);
    assert!(Version(2, 24, 3) > Version(2, 19, 0) && Version(2, 9, 0) < Version(2, 10, 3));
    assert_eq!(Version(2, 30, 7).to_string(), "2.30.7");
}

/// A file named with its version needs no read; one named `libnccl.so.2` is read for its banner, past
/// a banner-like text with no version in it (NCCL's own "NCCL version mismatch"), and nothing is loaded:
/// the "library" here is no ELF file at all.
#[test]
fn nccls_version_is_read_from_its_files_name_or_banner() {
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join("libnccl.so.2.21.5");
    std::fs::write(&named, b"not read").unwrap();
    assert_eq!(nccl_of_file(&named), Some(Version(2, 21, 5)));
    let plain = dir.path().join("libnccl.so.2");
    std::fs::write(&plain, b"\0\0NCCL version mismatch\0NCCL version 2.28.9+cuda13.0\0").unwrap();
    assert_eq!(nccl_of_file(&plain), Some(Version(2, 28, 9)));
    std::fs::write(&plain, b"NCCL version \0").unwrap();
    assert_eq!(nccl_of_file(&plain), None);
    assert_eq!(nccl_of_file(&dir.path().join("absent")), None);
}

/// A FIFO, a device or a symbolic link where a library was (a process read from outside may put one
/// there) is no file to read: answered at once, never waited on, never followed.
#[test]
fn only_a_regular_file_is_read_for_a_version() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("libnccl.so.2");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(nccl_of_file(&fifo), None);
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "not waited on");
    let real = dir.path().join("real");
    std::fs::write(&real, b"NCCL version 2.20.5\0").unwrap();
    let link = dir.path().join("lib").join("libnccl.so.2");
    std::fs::create_dir(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(nccl_of_file(&link), None, "a link is not followed");
    assert_eq!(nccl_of_file(&real), Some(Version(2, 20, 5)), "the file itself is read");
    assert_eq!(nccl_of_file(Path::new("/dev/zero")), None);
}

/// A FIFO is looked at, never opened: a writer waiting on it stays waiting, where an open of it for
/// reading, even non-blocking, once let the writer in (and an open of a device called its driver).
#[test]
fn a_fifo_is_not_opened_for_a_version() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("libnccl.so.2");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (opened, writer_in) = std::sync::mpsc::channel();
    let path = fifo.clone();
    let writer = std::thread::spawn(move || {
        let writing = std::fs::OpenOptions::new().write(true).open(&path);
        let _ = opened.send(());
        writing
    });
    // The writer waits in its open until a reader comes.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(nccl_of_file(&fifo), None);
    assert_eq!(open_regular(&fifo).map(drop), None);
    let let_in = writer_in.recv_timeout(std::time::Duration::from_millis(300)).is_ok();
    // This test's own reader lets the writer in, whatever happened.
    let reader = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK).open(&fifo);
    let _ = writer.join();
    drop(reader);
    assert!(!let_in, "the FIFO was opened: its writer was let in");
}

/// In an ELF file, only `.rodata` is searched: a banner outside it is not NCCL's.
#[test]
fn in_an_elf_file_the_banner_is_read_from_its_read_only_data() {
    let mut elf = vec![0u8; 0x40];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    let text = b"NCCL version 1.1.1\0";
    let rodata = b"xxNCCL version 2.19.3+cuda12.2\0";
    let names = b"\0.rodata\0.shstrtab\0";
    let text_at = elf.len();
    elf.extend_from_slice(text);
    let rodata_at = elf.len();
    elf.extend_from_slice(rodata);
    let names_at = elf.len();
    elf.extend_from_slice(names);
    let headers_at = elf.len();
    let header = |name: u32, offset: usize, length: usize| {
        let mut h = vec![0u8; 0x40];
        h[..4].copy_from_slice(&name.to_le_bytes());
        h[0x18..0x20].copy_from_slice(&(offset as u64).to_le_bytes());
        h[0x20..0x28].copy_from_slice(&(length as u64).to_le_bytes());
        h
    };
    elf.extend(header(0, 0, 0));
    elf.extend(header(1, rodata_at, rodata.len()));
    elf.extend(header(9, names_at, names.len()));
    elf[0x28..0x30].copy_from_slice(&(headers_at as u64).to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&0x40u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    elf[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libnccl.so.2");
    std::fs::write(&path, &elf).unwrap();
    assert_eq!(read_only_data(&std::fs::File::open(&path).unwrap()), Some(rodata.to_vec()));
    assert_eq!(nccl_of_file(&path), Some(Version(2, 19, 3)), "not the 1.1.1 outside .rodata");
    let _ = text_at;
}

#[test]
fn pytorchs_version_is_read_beside_its_library() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    let library = dir.path().join("lib").join("libtorch_cuda.so");
    assert_eq!(torch_of_package(library.parent().unwrap().parent().unwrap()), None);
    std::fs::write(dir.path().join("version.py"), "x = 1\n__version__ = '2.11.0+cu130'\n").unwrap();
    assert_eq!(
        torch_of_package(library.parent().unwrap().parent().unwrap()).as_deref(),
        Some("2.11.0+cu130")
    );
}

/// The loader's search, with a relative or empty element of LD_LIBRARY_PATH left out (a planted library
/// in the directory the process stands in is nobody's choice), and ld.so.cache read for the name.
#[test]
fn the_loaders_candidates_are_absolute_paths_only() {
    let planted = candidates(Some(std::ffi::OsStr::new(":lib::/opt/a:.")), &[], "libnccl.so.2");
    assert_eq!(planted[0], PathBuf::from("/opt/a/libnccl.so.2"), "{planted:?}");
    assert!(planted.iter().all(|p| p.is_absolute()), "{planted:?}");
    assert_eq!(planted.len(), 7, "one from LD_LIBRARY_PATH, six default directories: {planted:?}");
    let mut cache = b"ld.so-1.7.0\0\0\0\0".to_vec();
    let start = cache.len();
    cache.extend_from_slice(b"glibc-ld.so.cache1.1");
    cache.extend_from_slice(&2u32.to_le_bytes());
    cache.resize(start + 48, 0);
    let strings = start + 48 + 2 * 24;
    let entry = |key: usize, value: usize| {
        let mut e = vec![0u8; 24];
        e[4..8].copy_from_slice(&((key - start) as u32).to_le_bytes());
        e[8..12].copy_from_slice(&((value - start) as u32).to_le_bytes());
        e
    };
    let (k1, v1) = (strings, strings + 13);
    let (k2, v2) = (v1 + 27, v1 + 27 + 10);
    cache.extend(entry(k1, v1));
    cache.extend(entry(k2, v2));
    cache.extend_from_slice(b"libnccl.so.2\0/opt/nccl/lib/libnccl.so.2\0libc.so.6\0/lib/libc.so.6\0");
    assert_eq!(ld_so_cache(&cache, "libnccl.so.2"), vec![PathBuf::from("/opt/nccl/lib/libnccl.so.2")]);
    assert_eq!(candidates(None, &cache, "libnccl.so.2")[0], PathBuf::from("/opt/nccl/lib/libnccl.so.2"));
    assert_eq!(ld_so_cache(&cache, "libc.so.6"), vec![PathBuf::from("/lib/libc.so.6")]);
    assert!(ld_so_cache(&cache[..10], "libc.so.6").is_empty());
}

/// PyTorch's version is a short printable text: an empty one, one with a space, or one past 64
/// characters is none.
#[test]
fn pytorchs_version_is_a_short_printable_text() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    let library = dir.path().join("lib").join("libtorch_cuda.so");
    let of = |value: &str| {
        std::fs::write(dir.path().join("version.py"), format!("__version__ = '{value}'\n")).unwrap();
        torch_of_package(library.parent().unwrap().parent().unwrap())
    };
    assert_eq!(of(""), None);
    assert_eq!(of("2.11.0 beta"), None);
    assert_eq!(of(&"2".repeat(65)), None);
    assert_eq!(of(&"2".repeat(64)), Some("2".repeat(64)));
}

/// Section headers smaller than ELF64's (0x40 bytes) are no ELF64 file's: the whole file is searched,
/// not what such headers would say is `.rodata`.
#[test]
fn section_headers_smaller_than_elf64s_are_not_read() {
    let mut elf = vec![0u8; 0x40];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    let names_at = elf.len();
    elf.extend_from_slice(b".rodata\0");
    let rodata_at = elf.len();
    elf.extend_from_slice(b"NCCL version 2.19.3\0");
    let headers_at = elf.len();
    // Three headers of 0x20 bytes, read as 0x40 would make index 0 `.rodata` and index 1 the names.
    let mut table = vec![0u8; 0x60];
    table[0x18..0x20].copy_from_slice(&(rodata_at as u64).to_le_bytes());
    table[0x20..0x28].copy_from_slice(&4u64.to_le_bytes());
    table[0x38..0x40].copy_from_slice(&(names_at as u64).to_le_bytes());
    table[0x40..0x48].copy_from_slice(&8u64.to_le_bytes());
    elf.extend(table);
    elf[0x28..0x30].copy_from_slice(&(headers_at as u64).to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&0x20u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libnccl.so.2");
    std::fs::write(&path, &elf).unwrap();
    assert_eq!(read_only_data(&std::fs::File::open(&path).unwrap()), Some(elf));
    assert_eq!(nccl_of_file(&path), Some(Version(2, 19, 3)));
}

/// Whatever LD_LIBRARY_PATH and ld.so.cache say, the loader's default directories are searched last.
#[test]
fn the_loaders_default_directories_come_last() {
    let found = loader_candidates("libnccl.so.2");
    let defaults: Vec<PathBuf> =
        ["/lib64", "/usr/lib64", "/lib", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
            .iter()
            .map(|d| Path::new(d).join("libnccl.so.2"))
            .collect();
    assert!(found.ends_with(&defaults), "{found:?}");
}

/// `SIMPLE_IPC_NCCL_LIBRARY` names the NCCL read, before any the loader would find, and one it names
/// that is not there is none (asked of a child process of this test, whose environment is its own).
#[test]
fn the_nccl_its_setting_names_is_the_one_read() {
    const EXPECTED: &str = "SIMPLE_IPC_TEST_EXPECTED_NCCL";
    if let Some(expected) = std::env::var_os(EXPECTED) {
        assert_eq!(nccl().map(|v| v.to_string()).unwrap_or_default(), expected.to_string_lossy());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join("libnccl.so.2.21.5");
    std::fs::write(&named, b"not read").unwrap();
    for (library, expected) in [(named, "2.21.5"), (dir.path().join("absent"), "")] {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "placement::versions::tests::the_nccl_its_setting_names_is_the_one_read"])
            .env("SIMPLE_IPC_NCCL_LIBRARY", &library)
            .env(EXPECTED, expected)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&child.stdout);
        assert!(child.status.success() && said.contains("1 passed"), "{library:?}: {said}");
    }
}

/// Each number of a version is at most six digits, and each but the last ends at its dot: a longer one,
/// or one with text before its dot, is no version.
#[test]
fn a_versions_numbers_are_short_and_whole() {
    assert_eq!(Version::at_start_of("2.1234567.0"), None);
    assert_eq!(Version::at_start_of("2.123456.0"), Some(Version(2, 123456, 0)));
    assert_eq!(Version::at_start_of("2x.28.3"), None);
}
