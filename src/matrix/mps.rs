//! The matrix under MPS: where this process finds a daemon (see `placement::mps`), whether the importers of
//! each boundary's runs were its clients, as each said of itself in its place (`Place::mps`), beside the
//! table. A process whose pipe directory is not the daemon's (a mount namespace that hides it) runs
//! without MPS and says nothing of it: this says which.

use crate::placement::mps::Mps;
use crate::report::Document;

/// How many of a run's importers (the processes that joined it) were the daemon's clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Clients {
    pub clients: usize,
    pub of: usize,
}

impl Clients {
    /// What a cell's run said of its importers, where it said where they stand and how it ended: its
    /// importers are clients only where its parent's driver said its contexts were (its verdict says
    /// "under MPS", `parent` `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`); a socket alone makes none. Not known for a
    /// run that did not pass (no verdict of its own to say it).
    pub(super) fn of_run(document: Option<&Document>) -> Option<Self> {
        let document = document?;
        let placement = document.placement.as_ref()?;
        let under_mps = document.summary.as_ref()?.contains(", under MPS (");
        let of = placement.processes.len();
        let clients = placement.processes.iter().filter(|p| under_mps && p.place.mps.client).count();
        Some(Self { clients, of })
    }

    fn add(self, other: Self) -> Self {
        Self { clients: self.clients + other.clients, of: self.of + other.of }
    }
}

/// The rows' clients, summed over each row's runs (`None` where no run said).
pub(super) fn per_row(cells: &[Vec<Option<Clients>>]) -> Vec<Option<Clients>> {
    cells.iter().map(|line| line.iter().flatten().copied().reduce(Clients::add)).collect()
}

/// The lines after the table where `daemon` is a daemon this process is a client of: each row, and
/// whether its importers were clients too; `None` without a daemon.
pub(super) fn lines(
    daemon: &Mps,
    driver_says: bool,
    rows: &[&str],
    clients: &[Option<Clients>],
) -> Option<String> {
    if !daemon.client || !driver_says {
        return None;
    }
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut text = format!(
        "\nUnder MPS (the daemon of {}): the importers of each boundary's runs\n",
        daemon.pipe_directory
    );
    for (row, clients) in rows.iter().zip(clients) {
        let said = match clients {
            None => "not known (no run said where its processes stand)".to_owned(),
            Some(Clients { of: 0, .. }) => "none joined".to_owned(),
            Some(Clients { clients, of }) if clients == of => format!("its clients ({clients} of {of})"),
            Some(Clients { clients: 0, of }) => {
                format!("not its clients (0 of {of}): they ran without MPS (is the pipe directory shared?)")
            }
            Some(Clients { clients, of }) => format!("{clients} of {of} its clients, the others without MPS"),
        };
        text.push_str(&format!("  {row:<width$}  {said}\n"));
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon(client: bool) -> Mps {
        Mps { pipe_directory: "/tmp/mps".into(), from_env: true, client, answered: None }
    }

    /// A run's importers are counted from its document: those that said they were the daemon's clients, of
    /// all that joined; a run that said nothing of where they stand counts as not known.
    #[test]
    fn a_runs_clients_are_its_importers_that_said_so() {
        // (A process's placement is built as its document says it, from this process's place.)
        let placement = |clients: &[bool]| -> crate::placement::Placement {
            let place = |client: bool| {
                let mut place = crate::placement::Place::here();
                place.mps.client = client;
                serde_json::to_value(place).unwrap()
            };
            let processes: Vec<_> = clients
                .iter()
                .enumerate()
                .map(|(index, &client)| {
                    let place = place(client);
                    serde_json::json!({"index": index, "place": place, "shares": [], "forecast": [], "libraries": []})
                })
                .collect();
            serde_json::from_value(serde_json::json!({"server": place(false), "processes": processes}))
                .unwrap()
        };
        let mut document = crate::report::document::example();
        document.placement = None;
        assert_eq!(Clients::of_run(Some(&document)), None, "no placement: not known");
        assert_eq!(Clients::of_run(None), None, "no document");
        document.placement = Some(placement(&[true, false, true]));
        document.summary =
            Some("1 process on 1 GPU, legacy IPC, events, under MPS (the daemon of /tmp/mps)".into());
        assert_eq!(Clients::of_run(Some(&document)), Some(Clients { clients: 2, of: 3 }));
        // Its parent's driver said no MPS: a socket alone makes no client.
        document.summary = Some("1 process on 1 GPU, legacy IPC, events".into());
        assert_eq!(Clients::of_run(Some(&document)), Some(Clients { clients: 0, of: 3 }));
        document.summary = None;
        assert_eq!(Clients::of_run(Some(&document)), None, "no verdict of its own: not known");
        let rows = per_row(&[vec![Some(Clients { clients: 3, of: 3 }), Some(Clients { clients: 3, of: 3 })]]);
        assert_eq!(rows, [Some(Clients { clients: 6, of: 6 })], "summed, not multiplied");
        let text = lines(&daemon(true), true, &["none"], &[Some(Clients { clients: 0, of: 0 })]).unwrap();
        assert!(text.contains("none  none joined"), "{text}");
    }

    #[test]
    fn each_row_says_whether_its_importers_were_the_daemons_clients() {
        let cells = vec![
            vec![Some(Clients { clients: 2, of: 2 }), None, Some(Clients { clients: 2, of: 2 })],
            vec![Some(Clients { clients: 0, of: 2 })],
            vec![Some(Clients { clients: 1, of: 2 }), Some(Clients { clients: 0, of: 2 })],
            vec![None],
        ];
        let rows = per_row(&cells);
        assert_eq!(rows[0], Some(Clients { clients: 4, of: 4 }), "summed over the row's runs");
        let text = lines(&daemon(true), true, &["same", "hidden", "some", "unsaid"], &rows).unwrap();
        assert!(text.starts_with("\nUnder MPS (the daemon of /tmp/mps): "), "after the table: {text}");
        assert!(text.contains("same    its clients (4 of 4)"), "{text}");
        assert!(text.contains("hidden  not its clients (0 of 2): they ran without MPS"), "{text}");
        assert!(text.contains("some    1 of 4 its clients"), "{text}");
        assert!(text.contains("unsaid  not known"), "{text}");
        assert_eq!(lines(&daemon(false), true, &["same"], &rows), None, "no daemon: nothing said");
        assert_eq!(
            lines(&daemon(true), false, &["same"], &rows),
            None,
            "the driver said no MPS: nothing said"
        );
    }
}
