//! The container matrix's axes (`--ipc all --isolate KINDS`, see `matrix`): its columns, each a kind of
//! handle and the run that tries it alone, and its rows, each a boundary between the exporter and the
//! importers, made of the namespaces a container may give a process of its own.

use crate::ipc::{Fds, Mechanism, Sync};
use crate::isolation::{Isolation, Kind};

/// One kind of handle: the run that tries it (`--ipc`, `--sync`, and `--fds`: `Pidfd` where the importers
/// fetch the descriptor with `pidfd_getfd` instead of receiving it over the socket).
pub(super) struct Column {
    pub title: &'static str,
    pub mechanism: Mechanism,
    pub sync: Sync,
    pub fds: Fds,
}

impl Column {
    const fn new(title: &'static str, mechanism: Mechanism, sync: Sync) -> Self {
        Self { title, mechanism, sync, fds: Fds::Socket }
    }
}

/// The columns, as `placement::forecast::PATHS` names them. The last is the kernel's, not the driver's:
/// what PyTorch's expandable segments and UCX do with a VMM descriptor (a refusal is `ESRCH` or `EPERM`).
pub(super) const COLUMNS: [Column; 6] = [
    Column::new("legacy memory", Mechanism::Legacy, Sync::Memops),
    Column::new("legacy event", Mechanism::Vmm, Sync::Events),
    Column::new("VMM fd", Mechanism::Vmm, Sync::Memops),
    Column::new("pool fd", Mechanism::Pool, Sync::Events),
    Column::new("fabric", Mechanism::Fabric, Sync::Memops),
    Column { fds: Fds::Pidfd, ..Column::new("VMM fd by pidfd_getfd", Mechanism::Vmm, Sync::Memops) },
];

/// One boundary: the `--isolate` of its runs.
pub(super) struct Boundary {
    pub title: String,
    pub isolate: String,
}

/// The boundaries of a container, one at a time, then all of Docker's default set together.
const BOUNDARIES: [(&str, &str, &[Kind]); 7] = [
    ("same namespaces", "none", &[]),
    ("own PID namespaces, other pid numbers", "joiners:pid", &[Kind::Pid]),
    ("own PID namespaces, the same pid number", "pid", &[Kind::Pid]),
    ("own /dev/shm", "shm", &[Kind::Shm]),
    (
        "own SysV IPC, net, UTS, cgroup",
        "ipc,net,uts,cgroup",
        &[Kind::Ipc, Kind::Net, Kind::Uts, Kind::Cgroup],
    ),
    ("own user namespace (root mapped)", "user", &[Kind::User]),
    ("Docker's default set (container)", "container", &Kind::CONTAINER),
];

/// The rows for `asked`: the same namespaces, every boundary made only of asked kinds, and the asked set
/// itself where no row is it.
pub(super) fn boundaries(asked: &Isolation) -> Vec<Boundary> {
    let mut rows: Vec<Boundary> = BOUNDARIES
        .iter()
        .filter(|(_, _, kinds)| kinds.iter().all(|k| asked.has(*k)))
        .map(|(title, isolate, _)| Boundary { title: (*title).to_owned(), isolate: (*isolate).to_owned() })
        .collect();
    let is_asked = |row: &Boundary| {
        Isolation::parse(&row.isolate).is_ok_and(|i| i.kinds == asked.kinds && !i.joiners_only)
    };
    if !asked.kinds.is_empty() && !rows.iter().any(is_asked) {
        rows.push(Boundary { title: format!("own {}", asked.kinds_arg()), isolate: asked.to_string() });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns are the forecast's paths, in its order: the server's forecast of a served run and the
    /// matrix speak of one set of handles.
    #[test]
    fn the_columns_are_the_forecasts_paths() {
        let titles: Vec<&str> = COLUMNS.iter().map(|c| c.title).collect();
        assert_eq!(titles, crate::placement::forecast::PATHS);
        assert_eq!(COLUMNS.iter().filter(|c| c.fds == Fds::Pidfd).count(), 1, "one column is the kernel's");
    }

    #[test]
    fn the_rows_are_the_boundaries_made_of_the_asked_kinds() {
        let titles = |asked: &str| -> Vec<String> {
            boundaries(&Isolation::parse(asked).unwrap()).into_iter().map(|b| b.isolate).collect()
        };
        assert_eq!(
            titles("container"),
            ["none", "joiners:pid", "pid", "shm", "ipc,net,uts,cgroup", "container"]
        );
        assert_eq!(titles("pid"), ["none", "joiners:pid", "pid"]);
        assert_eq!(titles("net"), ["none", "net"], "a set that is no row is a row of its own");
        assert_eq!(titles("container,user").len(), 8, "every row, and the asked set whole");
    }
}
