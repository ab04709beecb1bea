use std::os::fd::AsFd;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use super::*;

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap()
}

fn refused() -> Refused {
    Refused {
        call: "cuIpcOpenEventHandle".into(),
        code: 205,
        error: "CUDA_ERROR_MAP_FAILED".into(),
        event: true,
        fix: Some("--sync memops".into()),
        beyond_the_simulation: false,
        pidfd: None,
    }
}

/// The kernel's refusal of a descriptor's fetch (`--fds pidfd`), as a joiner says it.
fn kernel_refused() -> Refused {
    use crate::ipc::pidfd::{Obstacle, PidfdRefusal};
    let obstacles = vec![Obstacle::OtherUid { exporter: 0, importer: 65534 }, Obstacle::NoCapSysPtrace];
    Refused {
        call: "pidfd_getfd".into(),
        code: 1,
        error: "EPERM".into(),
        event: false,
        fix: Some("--cap-add SYS_PTRACE, or --fds socket".into()),
        beyond_the_simulation: false,
        pidfd: Some(PidfdRefusal::Ptrace { obstacles }),
    }
}

fn every_variant() -> Vec<Message> {
    let diagnosis = Diagnosis::new("both pid 2".into(), "; what fixes it: ", "one PID namespace".into());
    let failed = RunEnd::Failed { process: Some(1), why: "Process 1 failed! (exit code 1: corrupt)".into() };
    vec![
        Message::Ask { bench_only: false, place: Some(Box::new(Place::here())) },
        Message::Ask { bench_only: true, place: None },
        Message::Admit { index: 3, processes: 5, round: None },
        Message::Admit { index: 1, processes: 2, round: Some(Round { number: 2, of: 4 }) },
        Message::Refuse("the run has all the processes it needs".into()),
        Message::Ended(0, String::new(), None, None),
        Message::Ended(1, "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_CONTEXT".into(), None, None),
        Message::Ended(1, "opening: both pid 2".into(), Some(diagnosis.clone()), Some(Box::new(refused()))),
        Message::Ended(1, "fetching: EPERM".into(), Some(diagnosis), Some(Box::new(kernel_refused()))),
        Message::RunEnded(RunEnd::Passed),
        Message::RunEnded(failed),
        Message::RunEnded(RunEnd::Failed { process: None, why: "the run did not finish within 2 s".into() }),
        Message::RunEnded(RunEnd::Waived("no fabric here".into())),
        Message::SequenceEnded(vec![
            RunEnd::Waived("no legacy here".into()),
            RunEnd::Passed,
            RunEnd::Failed { process: None, why: "Process 1 failed!".into() },
        ]),
        Message::SequenceEnded(Vec::new()),
        Message::HandBack,
        Message::Descriptors { mechanism: 3, count: 32 },
    ]
}

#[test]
fn every_message_comes_back_as_it_went() {
    for message in every_variant() {
        let bytes = message.encode().unwrap();
        assert_eq!(Message::decode(&bytes).unwrap(), message, "{:?}", String::from_utf8_lossy(&bytes));
    }
}

/// The layouts hand-made clients write (the tests' hostile ones, a fake server) mean what they meant.
#[test]
fn hand_made_messages_mean_what_they_say() {
    assert_eq!(Message::decode(b"SIPCHELO").unwrap(), Message::Ask { bench_only: false, place: None });
    let not_json = Message::decode(b"SIPCHELOnot json").unwrap();
    assert_eq!(not_json, Message::Ask { bench_only: false, place: None }, "a place that is none is none");
    assert_eq!(Message::decode(b"SIPCDONE\0").unwrap(), Message::Ended(0, String::new(), None, None));
    assert_eq!(Message::decode(b"SIPCDONE").unwrap(), Message::Ended(1, String::new(), None, None));
    assert_eq!(Message::decode(b"SIPCFULLnot yours").unwrap(), Message::Refuse("not yours".into()));
    let waived = Message::SequenceEnded(vec![RunEnd::Waived("nothing here".into())]);
    assert_eq!(Message::decode(b"SIPCLASTwnothing here\0").unwrap(), waived);
}

/// Every text that comes over the wire is made printable as it is decoded.
#[test]
fn text_from_the_wire_is_decoded_printable() {
    let evil = "\x1b[2K\rPASSED\x1b]0;t\x07";
    let escaped = "\\u{1b}[2K\\rPASSED\\u{1b}]0;t\\u{7}";
    let diagnosis = |text: &str| Some(Diagnosis::new(text.into(), "; what fixes it: ", text.into()));
    let refusal =
        |text: &str| Some(Box::new(Refused { call: text.into(), fix: Some(text.into()), ..refused() }));
    let mut place = Place::here();
    place.hostname = evil.into();
    let mut printable_place = place.clone();
    printable_place.hostname = escaped.into();
    for (sent, heard) in [
        (Message::Refuse(evil.into()), Message::Refuse(escaped.into())),
        (
            Message::Ended(1, evil.into(), diagnosis(evil), refusal(evil)),
            Message::Ended(1, escaped.into(), diagnosis(escaped), refusal(escaped)),
        ),
        (Message::RunEnded(RunEnd::Waived(evil.into())), Message::RunEnded(RunEnd::Waived(escaped.into()))),
        (
            Message::SequenceEnded(vec![RunEnd::Failed { process: None, why: evil.into() }]),
            Message::SequenceEnded(vec![RunEnd::Failed { process: None, why: escaped.into() }]),
        ),
        (
            Message::Ask { bench_only: false, place: Some(Box::new(place)) },
            Message::Ask { bench_only: false, place: Some(Box::new(printable_place)) },
        ),
    ] {
        assert_eq!(Message::decode(&sent.encode().unwrap()).unwrap(), heard);
    }
}

#[test]
fn malformed_messages_are_errors_that_say_what_is_wrong() {
    for (bytes, says) in [
        (&b""[..], "does not send"),
        (b"hello world!", "it starts \"hello wo\""),
        (b"\x1b]0;evil", "\\u{1b}"),
        (b"SIPCJOIN{", "an admission whose body"),
        (b"SIPCJOIN[1,2]", "an admission whose body"),
        (b"SIPCOVER\"Lost\"", "a run's end whose end"),
        (b"SIPCLASTx\0", "a sequence's end with a run's end of kind 120"),
        (b"SIPCFDS1[1]", "the buffers' descriptors whose body"),
    ] {
        let error = format!("{:#}", Message::decode(bytes).unwrap_err());
        assert!(error.contains(says), "{bytes:?}: {error}");
    }
}

/// Texts are cut at their bounds, so that every message fits the reader's buffer, JSON's escapes and all.
#[test]
fn long_texts_are_cut_to_fit_the_buffer() {
    let long = "\x07".repeat(100_000);
    let diagnosis = Some(Diagnosis::new(long.clone(), "", long.clone()));
    for message in [
        Message::Refuse(long.clone()),
        Message::Ended(1, long.clone(), diagnosis, None),
        Message::RunEnded(RunEnd::Waived(long.clone())),
        Message::SequenceEnded(vec![RunEnd::Waived(long.clone()); 20]),
    ] {
        assert!(message.encode().unwrap().len() <= MAX_MESSAGE);
    }
    assert_eq!(cut("é中x", 4), "é", "at a character's boundary");
    assert_eq!(cut("a\0b", 10), "a b", "without NULs");
}

#[test]
fn a_round_is_k_of_m() {
    assert_eq!(Round::parse("2/4"), Ok(Round { number: 2, of: 4 }));
    for bad in ["0/3", "4/3", "x", "1/", "1/2/3", "4/4/3"] {
        assert!(Round::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(Round::parse("2/4").unwrap().to_string(), "2/4");
}

#[test]
fn printable_escapes_control_characters_only() {
    assert_eq!(
        printable("exit code 1: CUDA_ERROR_MAP_FAILED (é, 中)"),
        "exit code 1: CUDA_ERROR_MAP_FAILED (é, 中)"
    );
    assert_eq!(printable("\x1b[32mPASSED\x1b[0m"), "\\u{1b}[32mPASSED\\u{1b}[0m");
    assert_eq!(printable("a\rb\nc\td\x07e\0f\x7f"), "a\\rb\\nc\\td\\u{7}e\\0f\\u{7f}");
    assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m", "a C1 control (CSI)");
    assert_eq!(printable("abc\u{202e}fed"), "abc\\u{202e}fed", "a bidirectional override");
    assert!(printable("\x1b]0;title\x07").chars().all(|c| !c.is_control()));
}

/// The descriptors come beside the message, owned; more than a message may carry is an error both ways.
#[test]
fn descriptors_come_beside_the_message() {
    let (a, b) = pair();
    let (x, _y) = nix::unistd::pipe().unwrap();
    let many: Vec<BorrowedFd> = (0..=MAX_FDS).map(|_| x.as_fd()).collect();
    let descriptors = Message::Descriptors { mechanism: 3, count: 2 };
    send(&a, &descriptors, &many[..2]).unwrap();
    let Heard::Said(heard, fds) = hear(&b, 1000).unwrap() else { panic!("nothing heard") };
    assert_eq!((heard, fds.len()), (descriptors, 2));
    assert!(send(&a, &Message::HandBack, &many).is_err(), "more than {MAX_FDS} descriptors");
    // One that sends more than a message may carry, by hand: an error, and every one of them is closed.
    let raw: Vec<RawFd> = many.iter().map(|fd| fd.as_raw_fd()).collect();
    let iov = [IoSlice::new(b"SIPCBACK")];
    sendmsg::<()>(a.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::empty(), None).unwrap();
    let error = format!("{:#}", hear(&b, 1000).err().unwrap());
    assert!(error.contains("33 descriptors came with a message, more than the 32"), "{error}");
    assert!(matches!(hear(&b, 0).unwrap(), Heard::Nothing));
    drop(a);
    assert!(matches!(hear(&b, 1000).unwrap(), Heard::Closed));
}

/// A refusal said at once, by a peer that closed with the joiner's question unread, is still heard.
#[test]
fn what_was_said_before_a_reset_is_heard() {
    let (a, b) = pair();
    send(&b, &Message::Ask { bench_only: false, place: None }, &[]).unwrap();
    send(&a, &Message::Refuse("not of this user".into()), &[]).unwrap();
    drop(a);
    let heard = hear(&b, 1000).unwrap();
    assert!(matches!(heard, Heard::Said(Message::Refuse(why), _) if why == "not of this user"));
    assert!(matches!(hear(&b, 1000).unwrap(), Heard::Closed));
}

/// A request to join whose place holds more than a field can (a 60 KB hostname: 723 KB of table once) is
/// heard without its place, as the server's door hears it; a place within its bounds is heard with every
/// text made printable, its settings and MPS pipe directory too.
#[test]
fn a_place_beyond_its_bounds_is_not_taken() {
    let mut place = Place::here();
    place.hostname = "h".repeat(60_000);
    let sent = [&b"SIPCHELO"[..], &serde_json::to_vec(&place).unwrap()].concat();
    assert!(sent.len() <= MAX_MESSAGE, "it fits the wire: only the bounds refuse it");
    assert_eq!(Message::decode(&sent).unwrap(), Message::Ask { bench_only: false, place: None });
    place.hostname = "h".repeat(64);
    place.gpus = Some(vec!["GPU-a".into(); 65]);
    let sent = [&b"SIPCHELB"[..], &serde_json::to_vec(&place).unwrap()].concat();
    assert_eq!(Message::decode(&sent).unwrap(), Message::Ask { bench_only: true, place: None });

    place.gpus = Some(vec!["GPU-a".into()]);
    place.settings = vec![("UCX_TLS".into(), "cuda_ipc\x1b[2J".into())];
    place.mps.pipe_directory = "/tmp/\nmps".into();
    let sent = [&b"SIPCHELO"[..], &serde_json::to_vec(&place).unwrap()].concat();
    let Message::Ask { place: Some(heard), .. } = Message::decode(&sent).unwrap() else {
        panic!("a place within its bounds is taken")
    };
    assert_eq!(heard.hostname, "h".repeat(64));
    assert_eq!(heard.settings, vec![("UCX_TLS".to_owned(), "cuda_ipc\\u{1b}[2J".to_owned())]);
    assert_eq!(heard.mps.pipe_directory, "/tmp/\\nmps");
}

/// A made path crosses to the guardian and back whole; a note cut short, or of a relative path, is none.
#[test]
fn a_made_path_crosses_to_the_guardian_whole() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let made_socket = crate::os::made_path::MadePath::of(&socket).unwrap();
    let made_dir = crate::os::made_path::MadePath::of(dir.path()).unwrap();
    use crate::os::made_path::MadePath;
    use crate::wire::guardian::Note;
    for note in [Note::Path(made_socket.clone()), Note::Forget(made_dir.clone())] {
        let bytes = note.encode().unwrap();
        assert_eq!(Note::decode(&bytes).as_ref(), Some(&note), "{bytes:?}");
    }
    let bytes = Note::Path(made_socket.clone()).encode().unwrap();
    assert_eq!(Note::decode(&bytes[..34]), None, "no path");
    assert_eq!(Note::decode(&bytes[..20]), None, "cut short");
    let relative = MadePath { path: "s".into(), ..made_socket.clone() };
    assert_eq!(Note::decode(&Note::Path(relative).encode().unwrap()), None, "not absolute");
}
