//! What the libraries that users run between two containers will do for this pair: NCCL's P2P and SHM
//! transports, UCX's cuda_ipc, PyTorch's CUDA IPC and its `expandable_segments`. Each library path is a
//! [`Recipe`]: the primitives it is made of (the container matrix's columns: legacy memory, legacy event,
//! a descriptor over a socket or by `pidfd_getfd`, fabric), for a version range and its settings, behind the
//! gates the library applies itself (host hash, /dev/shm identity, its own switches), each read in its
//! source (docs/placement.md cites file and line at a tag). A row's verdict is computed from its
//! primitives': forecast ones before a run, the run's measured ones after it ([`Primitives`]). Where the
//! library takes a slower path without a word, the row says it falls back, to what; where it rests on
//! something nobody measured, it says "not known", never "works".

mod nccl;
mod ucx_torch;

use super::Place;
use super::forecast::{Fix, Forecast, Verdict, fact};
use super::share::{Fact, Sameness};
use nccl::{nccl_p2p, nccl_shm};
use ucx_torch::{torch_expandable, torch_legacy, ucx};

/// The settings in a process's environment that change a library's path: read by `Place::here`, carried
/// with the place, and named in the rule of every row they change.
pub const SETTINGS: [&str; 9] = [
    "NCCL_CUMEM_ENABLE",
    "NCCL_CUMEM_HOST_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_HOSTID",
    "NCCL_IPC_USE_ABSTRACT_SOCKET",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC",
    "UCX_TLS",
];

/// The newest releases whose sources the rules were read in (docs/placement.md); a rule names the range
/// where an older one answers otherwise.
pub const READ_IN: &str = "NCCL 2.30.7, UCX 1.22.0 (and master 9466d104a3), PyTorch 2.11";

/// What a library path is made of, and how the library takes a failure of it.
pub struct Recipe {
    pub path: &'static str,
    /// The versions the recipe holds for, and where it came from.
    pub versions: &'static str,
    /// The primitives, by the container matrix's column names (`forecast::PATHS`).
    pub primitives: Vec<&'static str>,
    /// What the library does where a primitive fails: `None`, it fails (an error the user sees); else the
    /// transport it takes instead, without a word.
    pub falls_back_to: Option<&'static str>,
    pub source: &'static str,
}

/// The verdict of each primitive for the pair: the forecast's, or (after a run) what the run measured of
/// the primitives it took, which then stands in for the forecast.
pub struct Primitives<'a> {
    pub forecast: &'a [Forecast],
    /// Each primitive the run took, and what it saw: works, or the error it met.
    pub measured: &'a [(String, Verdict)],
}

impl Primitives<'_> {
    /// The verdict of `primitive`, and whether it was measured (not forecast).
    fn of(&self, primitive: &str) -> (Verdict, bool) {
        if let Some((_, seen)) = self.measured.iter().find(|(path, _)| path == primitive) {
            return (seen.clone(), true);
        }
        let forecast = self.forecast.iter().find(|f| f.path == primitive);
        (forecast.map_or(Verdict::NotKnown, |f| f.verdict.clone()), false)
    }
}

/// A setting of the pair: the exporter's where it set it, else the importer's (each process of a library
/// reads its own; a pair that disagrees is misconfigured, and the exporter decides what it exports).
fn setting<'a>(exporter: &'a Place, importer: &'a Place, name: &str) -> Option<&'a str> {
    let of = |place: &'a Place| place.settings.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    of(exporter).or_else(|| of(importer))
}

fn forecast(path: &str, verdict: Verdict, rule: String, fix: Option<Fix>) -> Forecast {
    Forecast { path: path.to_owned(), verdict, rule, fix, measured: false }
}

/// `recipe`'s row: its primitives' verdicts combined (a failure of any is the recipe's, as the library
/// takes it; then "not known" where any is), with `why` (its gates passed, its settings) before them.
fn from_primitives(recipe: &Recipe, primitives: &Primitives, why: &str) -> Forecast {
    let mut failed = None;
    let mut unknown = Vec::new();
    let mut said = Vec::new();
    for &primitive in &recipe.primitives {
        let (verdict, measured) = primitives.of(primitive);
        let how = if measured { "measured" } else { "forecast" };
        match &verdict {
            Verdict::Fails(error) if failed.is_none() => {
                // The least change is the failing primitive's, as its own forecast says it.
                let fix =
                    primitives.forecast.iter().find(|f| f.path == primitive).and_then(|f| f.fix.clone());
                failed = Some((format!("its {primitive}: {error}, {how}"), fix));
            }
            Verdict::Works => said.push(format!("{primitive}: works ({how})")),
            Verdict::NotKnown => unknown.push(primitive),
            _ => {}
        }
    }
    let rule = format!(
        "{why}; {} ({}) is made of {}; {}",
        recipe.path,
        recipe.versions,
        recipe.primitives.join(" + "),
        recipe.source
    );
    let measured = recipe.primitives.iter().any(|primitive| primitives.of(primitive).1);
    let row = match (failed, unknown.as_slice()) {
        (Some((failure, fix)), _) => match recipe.falls_back_to {
            None => forecast(recipe.path, Verdict::Fails(failure), rule, fix),
            Some(to) => forecast(
                recipe.path,
                Verdict::FallsBack(to.into()),
                format!("{failure}, which the library takes as unreachable; {rule}"),
                fix,
            ),
        },
        (None, []) => {
            let rule = if said.is_empty() { rule } else { format!("{rule} ({})", said.join(", ")) };
            forecast(recipe.path, Verdict::Works, rule, None)
        }
        (None, unknown) => forecast(
            recipe.path,
            Verdict::NotKnown,
            format!("rests on {}, which nobody measured for this pair; {rule}", unknown.join(", ")),
            None,
        ),
    };
    Forecast { measured, ..row }
}

/// Whether a setting says "off" as the libraries read it (`0`).
fn off(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim() == "0")
}

/// The forecast of each library path between `exporter` and `importer`, whose shared facts are `facts`
/// and whose primitives' verdicts are `primitives`.
pub fn libraries(
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
    primitives: &Primitives,
) -> Vec<Forecast> {
    let node = fact(facts, "boot_id");
    if node == Sameness::Differs {
        let rule = "the boot ids differ: another node, where every library uses its network transport (or, with \
                    an IMEX channel on both, fabric handles, which NCCL's MNNVL and PyTorch >= 2.8 use: not known \
                    here)";
        let both_imex = exporter.imex_channel && importer.imex_channel;
        return [NCCL_P2P, NCCL_SHM, UCX_LEGACY, UCX_CUMEM, TORCH_LEGACY, TORCH_EXPANDABLE]
            .into_iter()
            .map(|path| {
                let verdict =
                    if both_imex { Verdict::NotKnown } else { Verdict::FallsBack("the network".into()) };
                forecast(path, verdict, rule.into(), None)
            })
            .collect();
    }
    vec![
        nccl_p2p(exporter, importer, facts, primitives),
        nccl_shm(exporter, importer, facts, primitives),
        ucx(exporter, importer, facts, primitives, false),
        ucx(exporter, importer, facts, primitives, true),
        torch_legacy(primitives),
        torch_expandable(exporter, importer, facts, primitives),
    ]
}

pub(crate) const NCCL_P2P: &str = "NCCL P2P";
pub(crate) const NCCL_SHM: &str = "NCCL SHM";
pub(crate) const UCX_LEGACY: &str = "UCX cuda_ipc";
pub(crate) const UCX_CUMEM: &str = "UCX cuda_ipc, cuMem memory";
pub(crate) const TORCH_LEGACY: &str = "PyTorch CUDA IPC";
pub(crate) const TORCH_EXPANDABLE: &str = "PyTorch expandable_segments";

#[cfg(test)]
mod more_tests;
#[cfg(test)]
mod tests;
