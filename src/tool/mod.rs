//! The tool around the door: what this program adds to simpleIPC's story (`sample`), each branch behind a
//! seam of `sample::extras`. `parent` and `child` answer the seams for a run's options and start the story;
//! `team` (the processes that join, `--serve` and `--isolate`), `memops` (`--sync memops`) and `own_check`
//! (the parent's check of every buffer) are what they answer with.

pub(crate) mod child;
mod memops;
mod own_check;
pub(crate) mod parent;
mod team;
