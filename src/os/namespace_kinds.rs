//! What `--isolate` asks for, typed: the kinds of namespace a process can be given of its own, and which
//! processes get them. A leaf, so that the role (`role`) and the parse (`cli`) name an isolation without
//! reaching into `isolation`, which enters them.

use std::fmt;

use anyhow::{Result, bail};

/// One kind of namespace a process can be given of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A PID namespace: the process has a pid number of its own choosing (the same in every process).
    Pid,
    /// A mount namespace with a /dev/shm of its own (an empty tmpfs), as Docker's default `--ipc`.
    Shm,
    /// SysV IPC.
    Ipc,
    Net,
    Uts,
    Cgroup,
    /// A user namespace in which the process's user is root (uid 0 mapped to its own uid).
    User,
}

impl Kind {
    const ALL: [Kind; 7] = [Kind::Pid, Kind::Shm, Kind::Ipc, Kind::Net, Kind::Uts, Kind::Cgroup, Kind::User];
    /// What Docker gives a container by default (not a user namespace).
    pub const CONTAINER: [Kind; 6] = [Kind::Pid, Kind::Shm, Kind::Ipc, Kind::Net, Kind::Uts, Kind::Cgroup];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Pid => "pid",
            Kind::Shm => "shm",
            Kind::Ipc => "ipc",
            Kind::Net => "net",
            Kind::Uts => "uts",
            Kind::Cgroup => "cgroup",
            Kind::User => "user",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Which processes get namespaces of their own, and of which kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Isolation {
    pub kinds: Vec<Kind>,
    /// Only the processes that join are isolated; the serving parent stays where it was started (so that,
    /// with `pid`, their pid numbers differ from the parent's).
    pub joiners_only: bool,
}

impl Isolation {
    /// `pid`, `shm,net`, `container` (Docker's default set), `none`, each optionally after `joiners:`.
    pub fn parse(text: &str) -> Result<Self> {
        let (joiners_only, list) = match text.strip_prefix("joiners:") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let mut kinds = Vec::new();
        for name in list.split(',').map(str::trim) {
            match name {
                "container" => kinds.extend(Kind::CONTAINER),
                "none" => {}
                _ => match Kind::from_name(name) {
                    Some(kind) => kinds.push(kind),
                    None => bail!(
                        "'{name}' is no kind of namespace: give pid, shm, ipc, net, uts, cgroup, user, container \
                         or none, separated by commas, optionally after 'joiners:'"
                    ),
                },
            }
        }
        kinds.sort();
        kinds.dedup();
        Ok(Self { kinds, joiners_only })
    }

    pub fn has(&self, kind: Kind) -> bool {
        self.kinds.contains(&kind)
    }

    /// The kinds as `--isolated` takes them (`none` for none).
    pub fn kinds_arg(&self) -> String {
        if self.kinds.is_empty() {
            return "none".to_owned();
        }
        self.kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
    }

    /// How the run describes its isolation: the kinds, and the user namespace that a user who is not root
    /// gets with any of them (the kernel gives the others only inside one).
    pub fn described(&self) -> String {
        let implied = !self.kinds.is_empty()
            && !self.has(Kind::User)
            && crate::os::access::in_user_namespace_as_another_user();
        if implied { format!("{self}, in a user namespace: not root") } else { self.to_string() }
    }

    /// Whether the serving parent enters the namespaces too.
    pub fn includes_parent(&self) -> bool {
        !self.joiners_only && !self.kinds.is_empty()
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = if self.joiners_only { "joiners:" } else { "" };
        write!(f, "{who}{}", self.kinds_arg())
    }
}

/// clap's parser for `--isolate` and `--isolated`.
pub fn parse_arg(text: &str) -> Result<Isolation, String> {
    Isolation::parse(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_as_typed() {
        let container = Isolation::parse("container").unwrap();
        assert_eq!(container.kinds, Kind::CONTAINER.to_vec(), "Docker's default set, no user namespace");
        assert!(container.includes_parent());
        let joiners = Isolation::parse("joiners:pid").unwrap();
        assert_eq!((joiners.kinds.clone(), joiners.joiners_only), (vec![Kind::Pid], true));
        assert!(!joiners.includes_parent());
        assert_eq!(joiners.to_string(), "joiners:pid");
        let listed = Isolation::parse("user,pid,pid").unwrap();
        assert_eq!(listed.kinds, vec![Kind::Pid, Kind::User], "sorted, once each");
        assert_eq!(listed.kinds_arg(), "pid,user");
        let none = Isolation::parse("none").unwrap();
        assert!(none.kinds.is_empty() && !none.includes_parent());
        assert_eq!(none.kinds_arg(), "none");
        assert!(Isolation::parse("docker").unwrap_err().to_string().contains("'docker' is no kind"));
        assert!(Isolation::parse("pid,").is_err(), "an empty name is no kind");
    }
}
