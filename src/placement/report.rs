//! What the server says of where its processes stand, before anything runs: the table of what each shares
//! with it, the forecast of each kind of handle and each library path, and the least change for each path
//! that will not work; the same as data for the `--json` document's `placement`.

use serde::{Deserialize, Serialize};

use super::Place;
use super::forecast::{Fix, Forecast, Verdict, forecast};
use super::libraries::libraries;
use super::share::{Fact, compare, table};

/// One process that joined: its place, what it shares with the server, and the forecasts for the pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessPlacement {
    pub index: usize,
    pub place: Place,
    pub shares: Vec<Fact>,
    /// Each kind of handle (the container matrix's columns).
    pub forecast: Vec<Forecast>,
    /// Each library path.
    pub libraries: Vec<Forecast>,
}

/// The server's place and each joined process's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub server: Place,
    pub processes: Vec<ProcessPlacement>,
}

impl Placement {
    /// From the server's place and each joined process's, by index.
    pub fn of(server: Place, processes: Vec<(usize, Place)>) -> Self {
        let processes = processes
            .into_iter()
            .map(|(index, place)| {
                let shares = compare(&server, &place);
                ProcessPlacement {
                    index,
                    forecast: forecast(&shares, server.pid == place.pid),
                    libraries: libraries(&server, &place, &shares),
                    shares,
                    place,
                }
            })
            .collect();
        Self { server, processes }
    }

    /// The table, then for each group of processes with one forecast, its forecast and what fixes the paths
    /// that will not work.
    pub fn text(&self) -> String {
        let columns: Vec<(String, Vec<Fact>)> =
            self.processes.iter().map(|p| (format!("process {}", p.index), p.shares.clone())).collect();
        let mut text = format!(
            "Where the processes stand (the server is pid {} on {}):\n{}",
            self.server.pid,
            self.server.hostname,
            table(&columns)
        );
        let mut groups: Vec<(Vec<usize>, &ProcessPlacement)> = Vec::new();
        for process in &self.processes {
            let same = |g: &&mut (Vec<usize>, &ProcessPlacement)| {
                g.1.forecast == process.forecast && g.1.libraries == process.libraries
            };
            match groups.iter_mut().find(|g| same(g)) {
                Some(group) => group.0.push(process.index),
                None => groups.push((vec![process.index], process)),
            }
        }
        for (indices, process) in groups {
            let who = match indices.as_slice() {
                [one] => format!("process {one}"),
                many => {
                    format!("processes {}", many.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", "))
                }
            };
            text.push_str(&format!("Forecast for {who} (docs/placement.md says why):\n"));
            for forecasts in [&process.forecast, &process.libraries] {
                let said: Vec<String> =
                    forecasts.iter().map(|f| format!("{}: {}", f.path, word(&f.verdict))).collect();
                text.push_str(&format!("  {}\n", said.join("; ")));
            }
            let mut fixes: Vec<&Fix> = Vec::new();
            for fix in process.forecast.iter().chain(&process.libraries).filter_map(|f| f.fix.as_ref()) {
                if !fixes.contains(&fix) {
                    fixes.push(fix);
                }
            }
            for fix in fixes {
                let option = fix.option.as_ref().map(|o| format!("; or {o}")).unwrap_or_default();
                text.push_str(&format!(
                    "  what fixes it: Docker {}; Kubernetes {}{option}\n",
                    fix.docker, fix.kubernetes
                ));
            }
        }
        text
    }
}

fn word(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Works => "works".to_owned(),
        Verdict::Fails(error) => format!("fails ({error})"),
        Verdict::FallsBack(to) => format!("falls back to {to}"),
        Verdict::NotKnown => "not known".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::share::tests::place;

    #[test]
    fn the_server_says_the_table_the_forecasts_and_the_fixes() {
        let mut collides = place(1);
        collides.namespaces.pid = Some(8);
        let placement = Placement::of(place(1), vec![(0, place(2)), (1, place(3)), (2, collides)]);
        assert_eq!(placement.processes.len(), 3);
        let text = placement.text();
        assert!(text.starts_with("Where the processes stand (the server is pid 1 on node):\n"), "{text}");
        assert!(
            text.contains(
                "Forecast for processes 0, 1 (docs/placement.md says why):\n  legacy memory: works;"
            ),
            "{text}"
        );
        assert!(text.contains("Forecast for process 2 "), "{text}");
        assert!(text.contains("legacy memory: fails (CUDA_ERROR_INVALID_CONTEXT)"), "{text}");
        assert!(
            text.contains(
                "PyTorch expandable_segments: fails (pidfd_getfd: the exporter's pid is not visible"
            ),
            "{text}"
        );
        assert_eq!(
            text.matches("what fixes it: Docker --pid=container:NAME (one PID namespace)").count(),
            1,
            "once: {text}"
        );
        let json = serde_json::to_value(&placement).unwrap();
        assert_eq!(json["processes"][2]["shares"][0]["same"], "differs");
        assert_eq!(json["processes"][2]["forecast"][0]["verdict"], "fails");
        assert_eq!(serde_json::from_value::<Placement>(json).unwrap(), placement, "it reads back");
    }
}
