//! `--isolate`'s processes, now in `isolation::launch`.

pub(crate) use crate::isolation::launch::Launched;
