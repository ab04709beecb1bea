//! What the server says of where its processes stand, before anything runs: the table of what each shares
//! with it, the forecast of each kind of handle and each library path, and the least change for each path
//! that will not work; the same as data for the `--json` document's `placement`.

use serde::{Deserialize, Serialize};

use super::Place;
use super::forecast::{Fix, Forecast, Verdict, forecast};
use super::libraries::{Primitives, READ_IN, libraries};
use super::share::{Fact, compare, table};
use crate::ipc::{Fds, Mechanism, Sync};

/// One process that joined: its place, what it shares with the server, and the forecasts for the pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessPlacement {
    pub index: usize,
    pub place: Place,
    pub shares: Vec<Fact>,
    /// Each kind of handle (the container matrix's columns).
    pub forecast: Vec<Forecast>,
    /// Each library path, from its primitives' forecasts.
    pub libraries: Vec<Forecast>,
    /// Once the run is over, each library path again, where a primitive it is made of was measured by the
    /// run: the measured verdict stands in for that primitive's forecast.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libraries_measured: Option<Vec<Forecast>>,
}

/// The server's place and each joined process's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub server: Place,
    pub processes: Vec<ProcessPlacement>,
    /// Once the run is over: the forecast of each path it took beside what happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub against: Option<Vec<ForecastCheck>>,
}

/// What happened to a path the run took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "detail")]
pub enum PathOutcome {
    Worked,
    /// The driver refused its handle, with this error.
    Refused(String),
    /// The kernel refused to hand over its descriptor (`--fds pidfd`), with this errno (`ESRCH`).
    KernelRefused(String),
    /// The simulation does not model it (a test on the CPU, not the driver's answer).
    NotSimulated,
    /// The run ended before it was tried, or for another cause.
    Untried,
}

/// Who refused a handle of the run: the driver; the simulation, beyond what it models (not the driver's
/// answer); or the kernel, which refused a descriptor's fetch (`--fds pidfd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusedBy {
    Driver,
    BeyondTheSimulation,
    Kernel,
}

impl RefusedBy {
    /// Who refused `refused`: the kernel where it was a descriptor's fetch, else the simulation where it
    /// answered beyond what it models, else the driver.
    pub fn of(refused: &crate::ipc::refused::Refused) -> Self {
        match (refused.pidfd.is_some(), refused.beyond_the_simulation) {
            (true, _) => RefusedBy::Kernel,
            (false, true) => RefusedBy::BeyondTheSimulation,
            (false, false) => RefusedBy::Driver,
        }
    }
}

/// One path's forecast (the worst over the processes that joined) beside its outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForecastCheck {
    pub path: String,
    pub forecast: Verdict,
    #[serde(flatten)]
    pub outcome: PathOutcome,
    /// Whether they agree; `null` where either is not known.
    pub agrees: Option<bool>,
}

/// The paths a run of `mechanism` ordered by `sync` takes: its memory's, and the interprocess event's under
/// events (the container matrix's names). With `Fds::Pidfd`, the memory's descriptor is fetched with
/// `pidfd_getfd`: for vmm the matrix's "VMM fd by pidfd_getfd"; for pool, a path the matrix has no column
/// for, whose forecast is not known.
pub fn paths_of(mechanism: Mechanism, sync: Sync, fds: Fds) -> Vec<&'static str> {
    let memory = match (mechanism, fds) {
        (Mechanism::Legacy, _) => "legacy memory",
        (Mechanism::Vmm, Fds::Socket) => "VMM fd",
        (Mechanism::Vmm, Fds::Pidfd) => "VMM fd by pidfd_getfd",
        (Mechanism::Pool, Fds::Socket) => "pool fd",
        (Mechanism::Pool, Fds::Pidfd) => "pool fd by pidfd_getfd",
        (Mechanism::Fabric, _) => "fabric",
    };
    match sync {
        Sync::Events => vec![memory, "legacy event"],
        Sync::Memops => vec![memory],
    }
}

impl ProcessPlacement {
    /// Process `index` at `place`, which shares `shares` with `exporter`: the forecast of every kind of
    /// handle and every library path for the pair.
    pub fn forecast_for(exporter: &Place, index: usize, place: Place, shares: Vec<Fact>) -> Self {
        let forecast = forecast(exporter, &place, &shares);
        let primitives = Primitives { forecast: &forecast, measured: &[] };
        ProcessPlacement {
            index,
            libraries: libraries(exporter, &place, &shares, &primitives),
            libraries_measured: None,
            forecast,
            shares,
            place,
        }
    }
}

impl Placement {
    /// From the server's place and each joined process's, by index.
    pub fn of(server: Place, processes: Vec<(usize, Place)>) -> Self {
        let processes = processes
            .into_iter()
            .map(|(index, place)| {
                let shares = compare(&server, &place);
                ProcessPlacement::forecast_for(&server, index, place, shares)
            })
            .collect();
        Self { server, processes, against: None }
    }

    /// Each of `paths` (the memory's first), its forecast beside what the run saw: `passed`, or the driver's
    /// `refused` (the event's or the memory's handle), or neither (it failed for another cause).
    pub fn against(
        &self,
        paths: &[&str],
        passed: bool,
        refused: Option<(bool, &str, RefusedBy)>,
    ) -> Vec<ForecastCheck> {
        paths
            .iter()
            .enumerate()
            .map(|(at, path)| {
                let forecast = self.worst(path);
                let is_event = *path == "legacy event";
                let outcome = match refused {
                    _ if passed => PathOutcome::Worked,
                    Some((event, error, by)) if event == is_event => match by {
                        RefusedBy::BeyondTheSimulation => PathOutcome::NotSimulated,
                        RefusedBy::Driver => PathOutcome::Refused(error.to_owned()),
                        RefusedBy::Kernel => PathOutcome::KernelRefused(error.to_owned()),
                    },
                    // The memory's handle is opened before the event's.
                    Some((true, ..)) if at == 0 => PathOutcome::Worked,
                    _ => PathOutcome::Untried,
                };
                let agrees = match (&forecast, &outcome) {
                    (Verdict::Works, PathOutcome::Worked) => Some(true),
                    (
                        Verdict::Fails(said),
                        PathOutcome::Refused(error) | PathOutcome::KernelRefused(error),
                    ) => Some(said == error),
                    (Verdict::Works, PathOutcome::Refused(_) | PathOutcome::KernelRefused(_))
                    | (Verdict::Fails(_), PathOutcome::Worked) => Some(false),
                    _ => None,
                };
                ForecastCheck { path: (*path).to_owned(), forecast, outcome, agrees }
            })
            .collect()
    }

    /// Each library path again for every process, with the primitives the run measured (`against`) in
    /// place of their forecasts; the lines that say the rows resting on a measured primitive.
    pub fn measure_libraries(&mut self, against: &[ForecastCheck]) -> String {
        let measured: Vec<(String, Verdict)> = against
            .iter()
            .filter_map(|a| match &a.outcome {
                PathOutcome::Worked => Some((a.path.clone(), Verdict::Works)),
                PathOutcome::Refused(error) | PathOutcome::KernelRefused(error) => {
                    Some((a.path.clone(), Verdict::Fails(error.clone())))
                }
                PathOutcome::NotSimulated | PathOutcome::Untried => None,
            })
            .collect();
        if measured.is_empty() {
            return String::new();
        }
        let server = self.server.clone();
        let mut lines: Vec<String> = Vec::new();
        for process in &mut self.processes {
            let primitives = Primitives { forecast: &process.forecast, measured: &measured };
            let rows = libraries(&server, &process.place, &process.shares, &primitives);
            for row in rows.iter().filter(|row| row.measured) {
                let line = format!("  {}: {}", row.path, measured_word(row));
                if !lines.contains(&line) {
                    lines.push(line);
                }
            }
            process.libraries_measured = Some(rows);
        }
        match lines.is_empty() {
            true => String::new(),
            false => format!("The libraries, from what this run measured:\n{}\n", lines.join("\n")),
        }
    }

    /// The forecast of `path` for the run: a failure for any process is the run's; not known where no
    /// process has one for it.
    fn worst(&self, path: &str) -> Verdict {
        let verdicts = self.processes.iter().flat_map(|p| p.forecast.iter().filter(|f| f.path == path));
        if verdicts.clone().next().is_none() {
            return Verdict::NotKnown;
        }
        let mut worst = Verdict::Works;
        for verdict in verdicts.map(|f| &f.verdict) {
            match (verdict, &worst) {
                (Verdict::Fails(_), Verdict::Fails(_)) => {}
                (Verdict::Fails(_), _) | (Verdict::NotKnown, Verdict::Works) => worst = verdict.clone(),
                _ => {}
            }
        }
        worst
    }

    /// The table, then for each group of processes with one forecast, its forecast and what fixes the paths
    /// that will not work.
    pub fn text(&self) -> String {
        let title = format!(
            "Where the processes stand (the server is pid {} on {}):\n",
            self.server.pid, self.server.hostname
        );
        self.text_titled(&title, "shared with the server", ("process", "processes"))
    }

    /// [`text`](Self::text) of `--between`'s one direction: the exporter and the importer by their pids as
    /// the node sees them (the importer's is its index).
    pub fn text_between(&self) -> String {
        self.text_titled("", "shared with the exporter", ("pid", "pids"))
    }

    /// The table titled `title`, its first column `shared_with`, the processes called `who` (one, many).
    fn text_titled(&self, title: &str, shared_with: &str, (who, whose): (&str, &str)) -> String {
        let columns: Vec<(String, Vec<Fact>)> =
            self.processes.iter().map(|p| (format!("{who} {}", p.index), p.shares.clone())).collect();
        let mut text =
            format!("{title}{}", table(&columns).replacen("shared with the server", shared_with, 1));
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
                [one] => format!("{who} {one}"),
                many => {
                    format!("{whose} {}", many.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", "))
                }
            };
            text.push_str(&format!(
                "Forecast for {who} (docs/placement.md says why; the libraries as of {READ_IN}):\n"
            ));
            for forecasts in [&process.forecast, &process.libraries] {
                let said: Vec<String> =
                    forecasts.iter().map(|f| format!("{}: {}", f.path, word(&f.verdict))).collect();
                text.push_str(&format!("  {}\n", said.join("; ")));
            }
            // One line for each change of the containers, with every option that needs none of it.
            let mut fixes: Vec<(&Fix, Vec<&str>)> = Vec::new();
            for fix in process.forecast.iter().chain(&process.libraries).filter_map(|f| f.fix.as_ref()) {
                let same =
                    |(f, _): &(&Fix, Vec<&str>)| (&f.docker, &f.kubernetes) == (&fix.docker, &fix.kubernetes);
                let at = match fixes.iter().position(same) {
                    Some(at) => at,
                    None => {
                        fixes.push((fix, Vec::new()));
                        fixes.len() - 1
                    }
                };
                let options = &mut fixes[at].1;
                if let Some(option) = fix.option.as_deref().filter(|o| !options.contains(o)) {
                    options.push(option);
                }
            }
            for (fix, options) in fixes {
                let options: String = options.iter().map(|o| format!("; or {o}")).collect();
                text.push_str(&format!(
                    "  what fixes it: Docker {}; Kubernetes {}{options}\n",
                    fix.docker, fix.kubernetes
                ));
            }
        }
        text
    }
}

/// The forecast beside the outcome, a line each path; a path where they disagree is called out.
pub fn against_text(against: &[ForecastCheck]) -> String {
    let mut text = String::from("Forecast against outcome:\n");
    for a in against {
        let outcome = match &a.outcome {
            PathOutcome::Worked => "it worked".to_owned(),
            PathOutcome::Refused(error) => format!("the driver refused it ({error})"),
            PathOutcome::KernelRefused(error) => format!("the kernel refused it ({error})"),
            PathOutcome::NotSimulated => "not simulated".to_owned(),
            PathOutcome::Untried => "untried (the run ended for another cause first)".to_owned(),
        };
        let call = if a.agrees == Some(false) {
            " <- THE FORECAST WAS WRONG here: the driver may answer otherwise than measured (please report it)"
        } else {
            ""
        };
        text.push_str(&format!("  {}: forecast {}, {outcome}{call}\n", a.path, word(&a.forecast)));
    }
    text
}

/// What a row that rests on a measured primitive says of this pair: `works here (measured)`, `fails here:
/// its legacy event: CUDA_ERROR_MAP_FAILED, measured`, or `falls back to ... here: its ...`.
fn measured_word(row: &Forecast) -> String {
    match &row.verdict {
        Verdict::Works => "works here (measured)".to_owned(),
        Verdict::Fails(why) => format!("fails here: {why}"),
        Verdict::FallsBack(to) => {
            let cause = row.rule.split_once(", which the library").map_or("", |(cause, _)| cause);
            format!("falls back to {to} here: {cause}")
        }
        Verdict::NotKnown => "not known".to_owned(),
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
mod tests;
