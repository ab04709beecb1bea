//! What `/proc/<pid>/stat` says of a process: its state, its parent and its session. The command name before them is in
//! parentheses and may hold spaces or parentheses itself, so the fields are read after the last `)`.

/// A process as `/proc/<pid>/stat` describes it now.
pub struct ProcStat {
    /// `R`, `S`, `T` (stopped), `Z` (a zombie), `X` (dead), ...
    pub state: char,
    pub parent: i32,
    /// The session's id: its own pid where it leads a session (`setsid`).
    pub session: i32,
}

/// `None` where there is no such process (as this process's /proc sees it).
pub fn read(pid: i32) -> Option<ProcStat> {
    // Its name, in parentheses, need not be UTF-8.
    let stat = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/stat")).ok()?).into_owned();
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    let _group = fields.next()?;
    let session = fields.next()?.parse().ok()?;
    Some(ProcStat { state, parent, session })
}

/// `pid`'s number in its own (innermost) PID namespace, from `/proc/<pid>/status`: 1 for an init.
pub(crate) fn innermost_pid(pid: nix::unistd::Pid) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// Every process below `top`, as `/proc` says now (children before their own children).
pub(crate) fn descendants(top: nix::unistd::Pid) -> Vec<nix::unistd::Pid> {
    let all: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter_map(|pid| Some((pid, read(pid)?.parent)))
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![top.as_raw()];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        found.extend(all.iter().filter(|(_, p)| *p == parent).map(|(pid, _)| *pid));
        at += 1;
    }
    found.into_iter().skip(1).map(nix::unistd::Pid::from_raw).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_lives_and_its_parent_is_its_parent() {
        let me = read(std::process::id() as i32).unwrap();
        assert!(
            matches!(me.state, 'R' | 'S'),
            "it runs, or its main thread waits for this one: {}",
            me.state
        );
        assert_eq!(me.parent, nix::unistd::getppid().as_raw());
        assert_eq!(me.session, nix::unistd::getsid(None).unwrap().as_raw());
        assert!(read(i32::MAX).is_none());
        let me = nix::unistd::getpid();
        assert_eq!(innermost_pid(me), Some(me.as_raw() as u32), "its number in its own namespace: getpid's");
        assert_eq!(innermost_pid(nix::unistd::Pid::from_raw(i32::MAX)), None);
    }
}
