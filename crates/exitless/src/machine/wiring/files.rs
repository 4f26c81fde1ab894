//! The host files a machine's devices run on, disk images and tap queues, in the order the
//! configuration lists their devices: kept (duplicates of each descriptor) so that a same-host
//! live update (`migrate local:`) can hand them to the next exitless, and taken from there by
//! that exitless instead of opening its own. A passed descriptor shares its open file
//! description: an image's locks (held on the description) and a tap that lives only while a
//! file of it is open go with it, with no moment where neither process holds them.

use std::fs::File;

/// Disk images and tap queues, in the configuration's order.
#[derive(Debug, Default)]
pub struct HostFiles {
    /// One per disk on an image (not a vhost-user disk), in `MachineConfig::disks` order.
    pub images: Vec<File>,
    /// Each tap's queues, one list per NIC on a tap, in `MachineConfig::virtio` order.
    pub taps: Vec<Vec<File>>,
}

impl HostFiles {
    /// Duplicates of them all (the same open file descriptions), images first, then each
    /// tap's queues.
    pub fn duplicates(&self) -> std::io::Result<Vec<File>> {
        (self.images.iter())
            .chain(self.taps.iter().flatten())
            .map(File::try_clone)
            .collect()
    }

    /// `files` (as [`HostFiles::duplicates`] lays them out) split again into images and tap
    /// queues: `images` images, then `queues[k]` queues of the `k`th tap. `None` if the count
    /// is not theirs.
    pub fn split(files: Vec<File>, images: usize, queues: &[usize]) -> Option<Self> {
        if files.len() != images + queues.iter().sum::<usize>() {
            return None;
        }
        let mut files = files.into_iter();
        let images = files.by_ref().take(images).collect();
        let taps = (queues.iter())
            .map(|&n| files.by_ref().take(n).collect())
            .collect();
        Some(HostFiles { images, taps })
    }
}

/// Where the devices' host files come from as a machine is wired: opened by their names, or
/// taken from those another exitless handed over (counted against the configuration before,
/// `migration::local`, so none runs short); either way a duplicate of each is kept.
#[derive(Debug, Default)]
pub struct FileSource {
    /// Handed over, taken in order as devices are wired; `None`: open them.
    handed: Option<HostFiles>,
    /// What the machine's devices run on.
    pub kept: HostFiles,
}

impl FileSource {
    /// Take the files in `handed` rather than open any.
    pub fn handed(handed: HostFiles) -> Self {
        FileSource {
            handed: Some(handed),
            kept: HostFiles::default(),
        }
    }

    /// The next disk's image, if handed over.
    pub fn next_image(&mut self) -> Option<File> {
        let handed = self.handed.as_mut()?;
        (!handed.images.is_empty()).then(|| handed.images.remove(0))
    }

    /// The next tap's queues, if handed over.
    pub fn next_tap(&mut self) -> Option<Vec<File>> {
        let handed = self.handed.as_mut()?;
        (!handed.taps.is_empty()).then(|| handed.taps.remove(0))
    }
}
