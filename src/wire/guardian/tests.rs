use std::path::PathBuf;

use super::*;

fn file(m: u32) -> EventFile {
    EventFile { name: format!("cuda.shm.0.1f2e.{m:x}"), dev: 0x2a, ino: u64::from(m) << 40 }
}

fn made(path: &str, dir: bool) -> MadePath {
    let ctime = if dir { (0, 0) } else { (-1, 999_999_999) };
    MadePath { path: PathBuf::from(path), dev: u64::MAX, ino: 7, dir, ctime }
}

fn every_variant() -> Vec<Note> {
    vec![
        Note::File(file(1)),
        Note::Making(None),
        Note::Making(Some(Vec::new())),
        Note::Making(Some((0..MAX_LISTED as u32).map(file).collect())),
        Note::Made(None),
        Note::Made(Some(file(2))),
        Note::Path(made("/tmp/simple-ipc-1-0/run.sock", false)),
        Note::Path(made(&format!("/{}", "d".repeat(PATH_MAX - 1)), true)),
        Note::Forget(made("/tmp/s", false)),
        Note::MakingDir("/tmp/simple-ipc-1-0".into()),
        Note::NotMadeDir("/tmp/simple-ipc-1-0".into()),
    ]
}

#[test]
fn every_note_comes_back_as_it_went() {
    for note in every_variant() {
        let bytes = note.encode().unwrap();
        assert!(bytes.len() <= MAX_NOTE);
        assert_eq!(Note::decode(&bytes), Some(note));
    }
}

/// Today's bytes, as a hand-made parent writes them (`tests/guardian.rs`).
#[test]
fn the_bytes_are_the_kind_then_the_records() {
    let record = file(3).to_record();
    assert_eq!(Note::File(file(3)).encode().unwrap(), [&b"F"[..], &record].concat());
    assert_eq!(Note::Made(None).encode().unwrap(), [&b"D"[..], &[0; RECORD_BYTES]].concat());
    assert_eq!(Note::Making(Some(vec![file(3)])).encode().unwrap(), [&b"M"[..], &record].concat());
    let path = Note::Path(made("/s", false)).encode().unwrap();
    assert_eq!((path[0], path.len(), &path[PATH_HEAD..]), (b'P', PATH_HEAD + 3, &b"\0/s"[..]));
    assert_eq!(Note::MakingDir("/d".into()).encode().unwrap(), b"N/d");
    assert_eq!(Note::NotMadeDir("/d".into()).encode().unwrap(), b"X/d");
    assert_eq!(Note::MakingDir(format!("/{}", "d".repeat(PATH_MAX)).into()).encode(), None, "over PATH_MAX");
    assert_eq!(Note::decode(b"Nd"), None, "a relative path");
}

/// What cannot be said is not: a path over `PATH_MAX` is not sent, a list over `MAX_LISTED` says "not known",
/// and a record that names no file drops out of a list.
#[test]
fn the_limits_hold_on_the_way_out() {
    let long = made(&format!("/{}", "d".repeat(PATH_MAX)), false);
    assert_eq!(Note::Path(long.clone()).encode(), None);
    assert_eq!(Note::Forget(long).encode(), None);
    let many = Note::Making(Some((0..=MAX_LISTED as u32).map(file).collect()));
    assert_eq!(Note::decode(&many.encode().unwrap()), Some(Note::Making(None)));
    let unnamed = EventFile { name: "x".repeat(60), dev: 1, ino: 1 };
    let listed = Note::Making(Some(vec![unnamed.clone(), file(4)])).encode().unwrap();
    assert_eq!(Note::decode(&listed), Some(Note::Making(Some(vec![file(4)]))));
    assert_eq!(Note::decode(&Note::File(unnamed).encode().unwrap()), None);
}

/// Every prefix of every note, and the note with a byte more, is none or a note (never a panic); only the
/// `Making` notes' prefixes at a record's boundary and the paths' longer than the head are notes.
#[test]
fn cut_or_lengthened_notes_are_none() {
    for note in every_variant() {
        let bytes = note.encode().unwrap();
        for end in 0..bytes.len() {
            let cut = Note::decode(&bytes[..end]);
            let may_be = match note {
                Note::Making(_) => end >= 1 && (end - 1) % RECORD_BYTES == 0,
                Note::Path(_) | Note::Forget(_) => end > 1 + PATH_HEAD,
                Note::MakingDir(_) | Note::NotMadeDir(_) => end >= 2,
                _ => false,
            };
            assert!(cut.is_none() || may_be, "{end} bytes of {note:?}: {cut:?}");
        }
        let longer = [&bytes[..], b"x"].concat();
        let paths = (matches!(note, Note::Path(_) | Note::Forget(_))
            && bytes.len() < 1 + PATH_HEAD + PATH_MAX)
            || matches!(note, Note::MakingDir(_) | Note::NotMadeDir(_));
        assert!(Note::decode(&longer).is_none() || paths, "{note:?} and a byte");
    }
    let too_many = [&b"M"[..], &file(5).to_record().repeat(MAX_LISTED + 1)].concat();
    assert_eq!(Note::decode(&too_many), None, "a list over MAX_LISTED");
    for kind in *b"FMDPGNX" {
        let over = [&[kind][..], &[b'/'; MAX_NOTE]].concat();
        assert_eq!(Note::decode(&over), None, "{} bytes of kind {}", over.len(), kind as char);
    }
}

#[test]
fn malformed_notes_are_none() {
    let mut path = Note::Path(made("/s", true)).encode().unwrap();
    path[PATH_HEAD] = 2;
    for bytes in [&b""[..], b"X", b"F", b"M!!", &path, b"P\0", &[b'P'; 40]] {
        assert_eq!(Note::decode(bytes), None, "{bytes:?}");
    }
    let relative = [&Note::Path(made("/s", false)).encode().unwrap()[..1 + PATH_HEAD], b"s"].concat();
    assert_eq!(Note::decode(&relative), None);
}

/// Random bytes of every kind and length, and notes with random bytes changed, never panic the reader;
/// what it reads from them is a note that comes back as it went.
#[test]
fn random_bytes_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as usize
    };
    let valid: Vec<Vec<u8>> = every_variant().iter().filter_map(Note::encode).collect();
    for round in 0..20_000 {
        let mut bytes: Vec<u8> = if round % 2 == 0 {
            (0..next() % 300).map(|_| next() as u8).collect()
        } else {
            valid[next() % valid.len()].clone()
        };
        for _ in 0..next() % 4 {
            if let Some(byte) = bytes.get_mut(next() % 80) {
                *byte = next() as u8;
            }
        }
        if let Some(first) = bytes.first_mut().filter(|_| round % 4 == 0) {
            *first = b"FMDPGX"[next() % 6];
        }
        if let Some(note) = Note::decode(&bytes) {
            assert_eq!(Note::decode(&note.encode().unwrap()), Some(note), "{bytes:?}");
        }
    }
}

/// Over a socket as the guardian reads it: each note as sent, what is not a note skipped, end at EOF.
#[test]
fn notes_go_over_a_socket_and_end_at_its_close() {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (ours, theirs) =
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
    for note in every_variant() {
        tell(&ours, &note).unwrap();
    }
    send(ours.as_raw_fd(), b"X not a note", MsgFlags::empty()).unwrap();
    send(ours.as_raw_fd(), &[b'M'; MAX_NOTE + 7], MsgFlags::empty()).unwrap();
    tell(&ours, &Note::Made(None)).unwrap();
    drop(ours);
    let heard: Vec<Note> = notes(&theirs).collect();
    assert_eq!(heard, [every_variant(), vec![Note::Made(None)]].concat());
}
