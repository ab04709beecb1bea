//! A place that came from another process (a joiner's, over the socket): held to what each of its fields
//! can truly hold, its settings to those this program reads, and every text in it made printable, before
//! the server prints or keeps any of it.

use super::{Place, Platform, libraries};

/// The most characters each text of a place can truly hold, as the kernel and this program make it (a
/// place's JSON is at most 3000 bytes as this program sends it; the wire takes 64 KiB). A process that says
/// more is lying or broken, and the server, which prints these texts in a table and keeps them in its
/// document, takes none of its place ([`Place::received`]): one 60 KB hostname once made a 723 KB table.
pub(crate) mod bounds {
    /// `HOST_NAME_MAX`: the kernel's UTS nodename holds 64 bytes.
    pub const HOSTNAME: usize = 64;
    /// `/proc/sys/kernel/random/boot_id`: a UUID, 36 characters.
    pub const BOOT_ID: usize = 36;
    /// `PATH_MAX`: the MPS pipe directory is a path.
    pub const PATH: usize = 4096;
    /// An environment setting's value (`CUDA_VISIBLE_DEVICES`, `NCCL_HOSTID`, `PYTORCH_CUDA_ALLOC_CONF`,
    /// ...): far more than any of them needs (64 GPU UUIDs are 2.6 KB).
    pub const SETTING: usize = 4096;
    /// GPUs one process sees: more than any node has.
    pub const GPUS: usize = 64;
    /// A GPU's UUID (`GPU-` and 36 characters; a MIG device's is longer), with room to spare.
    pub const GPU: usize = 96;
    /// `/dev/shm`'s file system: `tmpfs`, `unknown`, or its magic number in hex (`0x` and 16 digits).
    pub const FILE_SYSTEM: usize = 18;
    /// What answered at the MPS control socket: a program's name (`NAME_MAX`, escaped) and its pid.
    pub const ANSWERED: usize = 4096;
    /// `pidfd_getfd` of itself: `allowed`, or an errno's name.
    pub const WORD: usize = 32;
}

impl Place {
    /// A place that came from another process, as the server takes it: the settings this program does not
    /// read dropped (a joiner of a newer simple-ipc may read more; nothing here would look at them), then
    /// held to [`bounds`] as it was sent, then every text made [`printable`](Self::printable). `Err` says,
    /// naming the field, why it is no place this program sends.
    pub fn received(mut self) -> Result<Self, String> {
        self.settings.retain(|(name, _)| libraries::SETTINGS.contains(&name.as_str()));
        match self.out_of_bounds() {
            Some(why) => Err(why),
            None => Ok(self.printable()),
        }
    }

    /// Where a place holds more than its field can truly hold ([`bounds`]), or a setting this program does
    /// not read (or one twice): which field, in words.
    pub(super) fn out_of_bounds(&self) -> Option<String> {
        // A setting's name labels its value below: only the names this program reads, each once.
        for (at, (name, _)) in self.settings.iter().enumerate() {
            if !libraries::SETTINGS.contains(&name.as_str()) {
                let name = crate::output::printable(&name.chars().take(bounds::HOSTNAME).collect::<String>());
                return Some(format!("it names a setting, '{name}', that this program does not read"));
            }
            if self.settings[..at].iter().any(|(earlier, _)| earlier == name) {
                return Some(format!("it names the setting {name} twice"));
            }
        }
        if let Some(gpus) =
            [&self.gpus, &self.gpus_present].into_iter().flatten().find(|g| g.len() > bounds::GPUS)
        {
            let most = bounds::GPUS;
            return Some(format!("it names {} GPUs, where a node has at most {most}", gpus.len()));
        }
        let env = "a setting of the environment this program reads";
        let mut texts: Vec<(&str, &str, usize, &str)> = vec![
            ("hostname", &self.hostname, bounds::HOSTNAME, "a hostname (HOST_NAME_MAX)"),
            ("MPS pipe directory", &self.mps.pipe_directory, bounds::PATH, "a path (PATH_MAX)"),
        ];
        let optional = [
            ("boot id", &self.boot_id, bounds::BOOT_ID, "a boot id (a UUID)"),
            ("CUDA_VISIBLE_DEVICES", &self.cuda_visible_devices, bounds::SETTING, env),
            ("NVIDIA_VISIBLE_DEVICES", &self.nvidia_visible_devices, bounds::SETTING, env),
            ("NCCL_HOSTID", &self.nccl_hostid, bounds::SETTING, env),
            (
                "answer at the MPS control socket",
                &self.mps.answered,
                bounds::ANSWERED,
                "what this program says of it",
            ),
            ("pidfd_getfd of itself", &self.pidfd_getfd_itself, bounds::WORD, "an errno's name"),
        ];
        texts.extend(optional.into_iter().filter_map(|(f, t, m, w)| Some((f, t.as_deref()?, m, w))));
        if let Some(shm) = &self.dev_shm {
            let what = "a file system's name or magic number";
            texts.push(("/dev/shm file system", &shm.file_system, bounds::FILE_SYSTEM, what));
        }
        for (name, value) in &self.settings {
            texts.push((name, value, bounds::SETTING, env));
        }
        for gpu in self.gpus.iter().flatten().chain(self.gpus_present.iter().flatten()) {
            texts.push(("GPU UUID", gpu, bounds::GPU, "a GPU's UUID"));
        }
        let platform = match &self.platform {
            Platform::Linux => None,
            Platform::Wsl2(why) | Platform::Tegra(why) => Some(why.as_str()),
        };
        if let Some(why) = platform {
            texts.push(("platform", why, bounds::SETTING, "what this program says of a platform"));
        }
        // Counted in characters: a text read lossily (a hostname, a path) holds one per byte it was read
        // from.
        texts.into_iter().find_map(|(field, text, most, what)| {
            let count = text.chars().count();
            (count > most)
                .then(|| format!("its {field} is {count} characters, where {what} holds at most {most}"))
        })
    }

    /// The same place with every text in it made [`printable`](crate::output::printable), so that none said
    /// by another process reaches a terminal raw (an escape sequence in a hostname, a newline in a setting).
    pub fn printable(mut self) -> Self {
        let printable = crate::output::printable;
        self.hostname = printable(&self.hostname);
        self.mps.pipe_directory = printable(&self.mps.pipe_directory);
        for text in [&mut self.boot_id, &mut self.cuda_visible_devices, &mut self.nvidia_visible_devices]
            .into_iter()
            .chain([&mut self.nccl_hostid, &mut self.mps.answered, &mut self.pidfd_getfd_itself])
            .flatten()
        {
            *text = printable(text);
        }
        if let Some(shm) = self.dev_shm.as_mut() {
            shm.file_system = printable(&shm.file_system);
        }
        for gpu in self.gpus.iter_mut().flatten().chain(self.gpus_present.iter_mut().flatten()) {
            *gpu = printable(gpu);
        }
        if let Platform::Wsl2(why) | Platform::Tegra(why) = &mut self.platform {
            *why = printable(why);
        }
        for (name, value) in &mut self.settings {
            *name = printable(name);
            *value = printable(value);
        }
        self
    }
}
