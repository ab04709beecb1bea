//! Whether this process runs in a container, and whose: what the waived verdict's words depend on (the
//! fix for a container without a GPU is the container engine's flag, not a driver install). A leaf.

/// The container engine this process runs under, as it marks its containers: Docker's `/.dockerenv`,
/// Podman's `/run/.containerenv`, or a Kubernetes pod's service environment; `None` elsewhere.
pub(crate) fn engine() -> Option<Engine> {
    engine_of(|path| std::path::Path::new(path).exists(), |name| std::env::var_os(name).is_some())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    Docker,
    Podman,
    Kubernetes,
}

impl Engine {
    /// How a container of this engine gets the node's GPUs and driver library.
    pub(crate) fn gpus_fix(self) -> &'static str {
        match self {
            Engine::Docker => {
                "start it with docker run --gpus all (the NVIDIA Container Toolkit on the host)"
            }
            Engine::Podman => {
                "start it with podman run --device nvidia.com/gpu=all (CDI, from the NVIDIA \
                               Container Toolkit)"
            }
            Engine::Kubernetes => {
                "give the container a GPU: resources.limits nvidia.com/gpu: 1 (NVIDIA's \
                                   device plugin or GPU Operator on the node)"
            }
        }
    }

    /// How a container of this engine is given the simulation's variable.
    pub(crate) fn simulation_hint(self, variable: &str) -> String {
        match self {
            Engine::Docker => format!("docker run -e {variable}=ok,ok IMAGE"),
            Engine::Podman => format!("podman run -e {variable}=ok,ok IMAGE"),
            Engine::Kubernetes => {
                format!("env: [{{name: {variable}, value: \"ok,ok\"}}] in the container's spec")
            }
        }
    }
}

fn engine_of(exists: impl Fn(&str) -> bool, set: impl Fn(&str) -> bool) -> Option<Engine> {
    if set("KUBERNETES_SERVICE_HOST") {
        Some(Engine::Kubernetes)
    } else if exists("/run/.containerenv") {
        Some(Engine::Podman)
    } else if exists("/.dockerenv") {
        Some(Engine::Docker)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_is_told_by_its_own_mark() {
        let none = |_: &str| false;
        assert_eq!(engine_of(none, none), None);
        assert_eq!(engine_of(|p| p == "/.dockerenv", none), Some(Engine::Docker));
        assert_eq!(engine_of(|p| p == "/run/.containerenv", none), Some(Engine::Podman));
        assert_eq!(engine_of(|_| true, |n| n == "KUBERNETES_SERVICE_HOST"), Some(Engine::Kubernetes));
        assert!(Engine::Docker.gpus_fix().contains("--gpus all"));
        assert_eq!(Engine::Docker.simulation_hint("V"), "docker run -e V=ok,ok IMAGE");
    }
}
