//! Where the machine or the GPUs decide before any namespace does: WSL2 and Tegra (no legacy CUDA IPC), an
//! importer that sees no GPU, one whose container lacks the exporter's GPU, one that hides it.

use super::super::Place;
use super::super::share::{Fact, Sameness};
use super::{Fix, Forecast, PATHS, Verdict};

/// Where the exporter or the importer runs on WSL2 or Tegra, which have no legacy CUDA IPC: its rows, the
/// others not known (nobody measured descriptors there).
pub(super) fn platform_rows(exporter: &Place, importer: &Place) -> Option<Vec<Forecast>> {
    let (name, why, source) = [exporter, importer].iter().find_map(|p| match &p.platform {
        super::super::Platform::Linux => None,
        super::super::Platform::Wsl2(why) => {
            Some(("WSL2", why.clone(), "CUDA on WSL's documentation, Limitations"))
        }
        super::super::Platform::Tegra(why) => {
            Some(("Tegra", why.clone(), "CUDA for Tegra's documentation, Memory Management: no cudaIpc*"))
        }
    })?;
    let rows = PATHS
        .iter()
        .map(|&path| {
            let legacy = path.starts_with("legacy");
            Forecast {
                path: path.to_owned(),
                verdict: if legacy {
                    Verdict::Fails("CUDA_ERROR_NOT_SUPPORTED".into())
                } else {
                    Verdict::NotKnown
                },
                rule: match legacy {
                    true => format!("{name} ({why}) has no legacy CUDA IPC ({source})"),
                    false => {
                        format!("{name} ({why}): descriptors and fabric handles were not measured there")
                    }
                },
                fix: None,
                measured: false,
            }
        })
        .collect();
    Some(rows)
}

/// Where the importer does not see a GPU the exporter's memory may be on: no GPU at all opens nothing; a GPU
/// its container does not have opens no memory of it; one only its `CUDA_VISIBLE_DEVICES` hides still opens
/// legacy handles (documented), and the descriptors' paths are not known (one GPU on the H200 host).
pub(super) fn unseen_gpus(
    rows: Vec<Forecast>,
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
) -> Vec<Forecast> {
    let Some(lacks) = facts.iter().find(|f| f.fact == "gpus" && f.same == Sameness::Differs) else {
        return rows;
    };
    let memory = |path: &str| path != "legacy event";
    // No GPU at all (`CUDA_VISIBLE_DEVICES=` or none given): no context, so nothing opens (measured on the
    // H200 host: a joiner with `CUDA_VISIBLE_DEVICES=` fails with CUDA_ERROR_NO_DEVICE).
    if importer.gpus.as_ref().is_some_and(Vec::is_empty) {
        return rows
            .into_iter()
            .map(|row| Forecast {
                verdict: Verdict::Fails("CUDA_ERROR_NO_DEVICE".into()),
                rule: "the importer sees no GPU at all (its CUDA_VISIBLE_DEVICES, or its container's GPUs): it has \
                       no CUDA context to open anything in; measured on the H200 host"
                    .into(),
                fix: Some(gpus_fix()),
                ..row
            })
            .collect();
    }
    // A GPU its container does not have at all (no device node, not in its driver's view): no memory of it
    // can be mapped there, whatever the handle: the cause to name before any other.
    let absent: Vec<&String> = match (&exporter.gpus, &importer.gpus_present) {
        (Some(theirs), Some(present)) => theirs.iter().filter(|g| !present.contains(g)).collect(),
        _ => Vec::new(),
    };
    if !absent.is_empty() {
        let names = absent.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", ");
        return rows
            .into_iter()
            .map(|row| match memory(&row.path) {
                true => Forecast {
                    verdict: Verdict::Fails("the importer's container has no such GPU".into()),
                    rule: format!(
                        "the importer's container does not have {names} (no device node in its root, or not in its \
                         driver's view): no memory of it can be mapped there, by any kind of handle"
                    ),
                    fix: Some(gpus_fix()),
                    ..row
                },
                false => row,
            })
            .collect();
    }
    // Hidden only by CUDA_VISIBLE_DEVICES: the container has the GPU.
    let present = importer.gpus_present.is_some();
    let what = lacks.detail.clone().unwrap_or_default();
    rows.into_iter()
        .map(|row| match row.verdict {
            Verdict::Works if present && row.path == "legacy memory" => Forecast {
                rule: format!(
                    "the importer {what} only by its CUDA_VISIBLE_DEVICES (its container has the GPU): a legacy handle \
                     opens on a device the importer does not see (cuIpcOpenMemHandle's documentation), not measured \
                     here; {}",
                    row.rule
                ),
                ..row
            },
            Verdict::Works if row.path != "legacy event" => Forecast {
                verdict: Verdict::NotKnown,
                rule: format!(
                    "the importer {what} (its CUDA_VISIBLE_DEVICES or its container's GPUs): a memory handle of a \
                     GPU it does not see is reported to fail (legacy IPC: invalid argument), not measured here"
                ),
                fix: Some(gpus_fix()),
                ..row
            },
            _ => row,
        })
        .collect()
}

fn gpus_fix() -> Fix {
    Fix {
        docker: "--gpus all (or the same --gpus device list) in both".into(),
        kubernetes: "the same GPUs for both containers (one pod, or a shared ResourceClaim)".into(),
        option: Some("CUDA_VISIBLE_DEVICES that names the exporter's GPU in the importer".into()),
    }
}
