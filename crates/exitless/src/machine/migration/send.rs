//! The source's side: passes over guest memory while the machine runs, then the switch-over
//! (pause, the last pages, the state, the target's answer, go). Until the target has been told
//! to go, any failure leaves the machine as it was: logging stopped, devices and vCPUs going on
//! if they were.

use std::io::{BufReader, BufWriter, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use xxhash_rust::xxh3::xxh3_64;

use crate::machine::migration::address::Stream;
use crate::machine::migration::local;
use crate::machine::migration::stream::{Counted, MAX_RUN, PAGE, Record, write_preface};
use crate::machine::migration::touched::PageMap;
use crate::machine::migration::{
    MAX_PASSES, Migrated, MigrationError, MigrationOptions, Progress, SendMigration, StreamError,
};
use crate::machine::snapshot::{SnapshotError, Snapshotter};
use crate::vm::run_control::StopReason;

/// Longest a write to the target or its answer may take: a target that stopped reading is a
/// failed migration, not a source stuck in a pause. Building the machine is the target's
/// longest step before it answers.
const PEER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The configuration record: the machine, and the exitless that sends it.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigRecord {
    /// The sender's `CARGO_PKG_VERSION`; a target of another version refuses it, as a
    /// restore does a snapshot of another.
    pub exitless_version: String,
    /// The machine, as built.
    pub config: crate::machine::MachineConfig,
}

/// The state record: the paused machine's state, and whether it was paused before the
/// migration (the target then stays paused).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateRecord {
    /// The user had paused it.
    pub paused: bool,
    /// Its vCPUs', VM's and devices' states.
    pub state: crate::machine::snapshot::MachineState,
}

/// A 64-bit hash of each page of guest memory as the target has it: all zero at first.
struct TargetPages {
    /// Each RAM region's first address and its pages' hashes.
    regions: Vec<(u64, Vec<u64>)>,
}

impl TargetPages {
    fn new(memory: &GuestMemoryMmap) -> Self {
        let zero = xxh3_64(&[0; PAGE]);
        let regions = memory
            .iter()
            .map(|r| {
                let len = usize::try_from(r.len()).expect("a mapped region fits usize");
                (r.start_addr().0, vec![zero; len.div_ceil(PAGE)])
            })
            .collect();
        TargetPages { regions }
    }

    fn hash(&mut self, gpa: u64) -> Option<&mut u64> {
        let (base, pages) = self
            .regions
            .iter_mut()
            .find(|(base, pages)| (*base..*base + (pages.len() * PAGE) as u64).contains(&gpa))?;
        pages.get_mut(usize::try_from((gpa - *base) / PAGE as u64).ok()?)
    }

    /// The pages a scan reads, as runs of at most [`MAX_RUN`] pages: `(first address,
    /// pages)`. Every page of RAM that is a shared file; of private RAM, the pages this
    /// process ever touched ([`PageMap`]) and those the target has other than zero (a page
    /// sent that is gone from the page tables since reads as zero now, and must be sent so).
    fn runs(&self, memory: &GuestMemoryMmap) -> Result<Vec<(u64, usize)>, MigrationError> {
        let zero = xxh3_64(&[0; PAGE]);
        let map = PageMap::open().map_err(StreamError::from)?;
        let mut runs = Vec::new();
        for ((base, hashes), region) in self.regions.iter().zip(memory.iter()) {
            let touched = match region.file_offset() {
                Some(_) => vec![true; hashes.len()],
                None => {
                    let host = region.as_ptr() as usize;
                    let len = hashes.len() * PAGE;
                    map.touched(host, len).map_err(StreamError::from)?
                }
            };
            let mut run: Option<(u64, usize)> = None;
            for (page, (&touched, &hash)) in touched.iter().zip(hashes).enumerate() {
                let gpa = base + (page * PAGE) as u64;
                if !touched && hash == zero {
                    runs.extend(run.take());
                    continue;
                }
                match &mut run {
                    Some((_, n)) if *n < MAX_RUN => *n += 1,
                    _ => {
                        runs.extend(run.take());
                        run = Some((gpa, 1));
                    }
                }
            }
            runs.extend(run);
        }
        Ok(runs)
    }
}

/// Pages on their way to the target: changed pages are gathered into runs of one kind (data
/// or zero) and written as one record each.
struct Copier<'a> {
    memory: &'a GuestMemoryMmap,
    target: TargetPages,
    out: BufWriter<Stream>,
    /// The run being gathered: its first address, and its data (empty for a zero run).
    run: Option<(u64, u64, Vec<u8>)>,
    pages: u64,
    bytes: u64,
}

impl Copier<'_> {
    fn record(&mut self, record: &Record) -> Result<(), MigrationError> {
        let mut counted = Counted::new(&mut self.out);
        record.write_to(&mut counted).map_err(StreamError::from)?;
        self.bytes += counted.bytes;
        Ok(())
    }

    /// Send the `n` pages from `gpa` that differ from what the target has; how many.
    fn copy(&mut self, gpa: u64, n: usize) -> Result<u64, MigrationError> {
        let mut data = vec![0; n * PAGE];
        self.memory
            .read_slice(&mut data, GuestAddress(gpa))
            .map_err(|e| SnapshotError::Field("memory".into(), e.to_string()))?;
        let zero = xxh3_64(&[0; PAGE]);
        let mut sent = 0;
        for (i, page) in data.chunks(PAGE).enumerate() {
            let at = gpa + (i * PAGE) as u64;
            let hash = xxh3_64(page);
            let Some(known) = self.target.hash(at) else {
                continue;
            };
            if *known == hash {
                continue;
            }
            *known = hash;
            sent += 1;
            self.gather(at, (hash != zero).then_some(page))?;
        }
        self.pages += sent;
        Ok(sent)
    }

    /// Add the page at `gpa` (its data, or `None` if all zero) to the run, writing the run
    /// first if the page does not extend it.
    fn gather(&mut self, gpa: u64, page: Option<&[u8]>) -> Result<(), MigrationError> {
        let extends = self.run.as_ref().is_some_and(|(start, count, data)| {
            start + count * PAGE as u64 == gpa
                && data.is_empty() == page.is_none()
                && *count < MAX_RUN as u64
        });
        if !extends {
            self.flush_run()?;
            self.run = Some((gpa, 0, Vec::new()));
        }
        let (_, count, data) = self.run.as_mut().expect("a run was started");
        *count += 1;
        if let Some(page) = page {
            data.extend_from_slice(page);
        }
        Ok(())
    }

    fn flush_run(&mut self) -> Result<(), MigrationError> {
        match self.run.take() {
            None => Ok(()),
            Some((gpa, pages, data)) if data.is_empty() => {
                self.record(&Record::Zeros { gpa, pages })
            }
            Some((gpa, _, data)) => self.record(&Record::Pages { gpa, data }),
        }
    }

    /// Send every page that differs from the target's.
    fn scan(&mut self) -> Result<u64, MigrationError> {
        let mut sent = 0;
        for (gpa, n) in self.target.runs(self.memory)? {
            sent += self.copy(gpa, n)?;
        }
        self.flush_run()?;
        Ok(sent)
    }

    /// Send the pages at `dirty` (page addresses, in order) that differ from the target's.
    fn dirty(&mut self, dirty: &[u64]) -> Result<u64, MigrationError> {
        let mut sent = 0;
        for &gpa in dirty {
            sent += self.copy(gpa, 1)?;
        }
        self.flush_run()?;
        Ok(sent)
    }
}

/// What the switch-over changed on the source, undone if the migration fails before `Go`.
struct Undo<'a> {
    snapshotter: &'a Snapshotter,
    /// The vCPUs were paused here (they ran before).
    vcpus: bool,
    /// The devices were stopped here.
    devices: bool,
    /// The disk images' locks were given up.
    locks: bool,
    /// The vhost-user backends were let go.
    backends: bool,
}

/// How long the source tries to take its images' locks and its vhost-user backends back: a
/// target that took them lets them go when it sees the stream end.
const RETAKE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        let s = self.snapshotter;
        if let Err(e) = s.vm.log_dirty_pages(false) {
            log::warn!("migration: {e}");
        }
        if self.locks {
            let deadline = Instant::now() + RETAKE_DEADLINE;
            for lock in &s.image_locks {
                while let Err(e) = lock.retake() {
                    if Instant::now() > deadline {
                        log::error!("migration: the VM goes on without its lock: {e}");
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
        if self.backends {
            let deadline = Instant::now() + RETAKE_DEADLINE;
            for backend in &s.backends {
                loop {
                    let last = Instant::now() > deadline;
                    if backend.reclaim(last) {
                        break;
                    }
                    if last {
                        log::error!(
                            "migration: a vhost-user device lost its backend: it needs a reset"
                        );
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
        if self.devices {
            s.persist.iter().for_each(|(_, device)| device.resume());
        }
        if self.vcpus {
            let _ = s.control.pause().resume();
        }
    }
}

/// Where a migration under way stands, if one is.
type ProgressSlot = Mutex<Option<Progress>>;

impl Snapshotter {
    /// Passes over memory, then the switch-over, told to `progress` as they go; on failure,
    /// the machine as it was, once the stream is closed (a target that took the images'
    /// locks lets them go).
    fn migrate(
        &self,
        options: &MigrationOptions,
        progress: &ProgressSlot,
    ) -> Result<Migrated, MigrationError> {
        let mut undo = Undo {
            snapshotter: self,
            vcpus: false,
            devices: false,
            locks: false,
            backends: false,
        };
        let sent = self.send_machine(options, &mut undo, progress);
        *progress.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let migrated = sent?;
        // The machine is the target's: this run ends, its devices stopped as they are.
        std::mem::forget(undo);
        self.control.stop(StopReason::Migrated);
        Ok(migrated)
    }

    /// Connect, send the passes, switch over; `undo` notes what to take back on failure.
    fn send_machine(
        &self,
        options: &MigrationOptions,
        undo: &mut Undo<'_>,
        slot: &ProgressSlot,
    ) -> Result<Migrated, MigrationError> {
        let report = |progress: &Progress| {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(progress.clone());
        };
        let start = Instant::now();
        let local = options.address.is_local();
        // A live update's files are gathered before the target is bothered.
        let files = match local {
            true => local::files_of(self.vm.memory(), &self.files)?,
            false => Vec::new(),
        };
        let stream = options.address.connect()?;
        let connect = options.address.failed("talk to the migration target at");
        stream.set_timeouts(PEER_DEADLINE).map_err(connect)?;
        if let (Stream::Unix(s), true) = (&stream, local) {
            // The files go with the stream's first bytes, which the target reads with them.
            let mut preface = Vec::new();
            write_preface(&mut preface).map_err(connect)?;
            local::send_with(s, &preface, &files).map_err(connect)?;
        }
        let mut answers = BufReader::new(stream.try_clone().map_err(connect)?);
        let mut copier = Copier {
            memory: self.vm.memory(),
            target: TargetPages::new(self.vm.memory()),
            out: BufWriter::with_capacity((MAX_RUN + 1) * PAGE, stream),
            run: None,
            pages: 0,
            bytes: 0,
        };
        if !local {
            write_preface(&mut copier.out).map_err(connect)?;
        }
        let config = serde_json::to_vec(&ConfigRecord {
            exitless_version: env!("CARGO_PKG_VERSION").into(),
            config: self.config.clone(),
        })
        .map_err(SnapshotError::Encode)?;
        copier.record(&Record::Config(config))?;
        copier.out.flush().map_err(connect)?;
        // The target makes its RAM (and VM) now, before anything pauses.
        expect(Record::Accepted, &mut answers)?;
        let mut progress = Progress::default();
        let mut dirty = Vec::new();
        if !local {
            self.vm.log_dirty_pages(true)?;
            // The first pass sends every page that is not zero; each later one what the vCPUs
            // wrote meanwhile, until what is left would fit the downtime at the rate measured.
            (progress.phase, progress.pass) = ("copying", 1);
            report(&progress);
            let pass_start = Instant::now();
            copier.scan()?;
            dirty = self.vm.dirty_pages()?;
            progress.passed(&copier, dirty.len(), pass_start, 0, start);
            report(&progress);
        }
        while !local
            && progress.pass < MAX_PASSES
            && progress.expected_downtime_ms > options.downtime_ms()
        {
            let (pass_start, before) = (Instant::now(), copier.bytes);
            progress.pass += 1;
            report(&progress);
            copier.dirty(&dirty)?;
            copier.out.flush().map_err(connect)?;
            dirty = self.vm.dirty_pages()?;
            progress.passed(&copier, dirty.len(), pass_start, before, start);
            report(&progress);
        }

        // The switch-over: nothing writes guest memory from here.
        progress.phase = "switching over";
        report(&progress);
        let paused_start = Instant::now();
        let paused = self.control.pause().paused();
        if !paused {
            self.control.pause_vcpus(options.pause_deadline)?;
            undo.vcpus = true;
        }
        self.pause_devices()?;
        undo.devices = true;
        let before = copier.pages;
        let mut scanned_pages = 0;
        if !local {
            dirty.extend(self.vm.dirty_pages()?);
            dirty.sort_unstable();
            dirty.dedup();
            copier.dirty(&dirty)?;
            scanned_pages = copier.scan()?;
        }
        let state = serde_json::to_vec(&StateRecord {
            paused,
            state: self.save_state()?,
        })
        .map_err(SnapshotError::Encode)?;
        copier.record(&Record::State(state))?;
        // A vhost-user backend serves one front-end at a time: the target connects to it once
        // the stream is whole (a backend on this host, or one of the same socket path there).
        undo.backends = true;
        for backend in &self.backends {
            // A thread that did not answer in time lets its backend go when it gets to it.
            let _ = backend.release();
        }
        // The target opens the images once the stream is whole: it takes their locks. A live
        // update's target holds them already, on the same open files.
        if !local {
            undo.locks = true;
            for lock in &self.image_locks {
                lock.release().map_err(connect)?;
            }
        }
        copier.record(&Record::End)?;
        copier.out.flush().map_err(connect)?;
        expect(Record::Ready, &mut answers)?;
        copier.record(&Record::Go)?;
        copier.out.flush().map_err(connect)?;
        Ok(Migrated {
            passes: progress.pass,
            files: files.len() as u64,
            pages: copier.pages,
            bytes: copier.bytes,
            final_pages: copier.pages - before,
            scanned_pages,
            downtime_ms: paused_start.elapsed().as_secs_f64() * 1e3,
            total_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// Read the target's answer: `wanted`, or its refusal.
fn expect(wanted: Record, answers: &mut impl std::io::Read) -> Result<(), MigrationError> {
    match Record::read_from(answers)? {
        answer if answer == wanted => Ok(()),
        Record::Refused(why) => Err(MigrationError::Refused(why)),
        other => Err(MigrationError::Order(format!("{other:?} for {wanted:?}"))),
    }
}

impl Progress {
    /// A pass that started at `pass_start`, the stream then at `bytes_before`, has ended with
    /// `dirty` pages logged meanwhile; the migration started at `start`.
    fn passed(
        &mut self,
        copier: &Copier<'_>,
        dirty: usize,
        pass_start: Instant,
        bytes_before: u64,
        start: Instant,
    ) {
        let took = pass_start.elapsed().as_secs_f64().max(1e-6);
        self.pages = copier.pages;
        self.bytes = copier.bytes;
        self.dirty_pages = dirty as u64;
        self.dirty_pages_per_s = dirty as f64 / took;
        self.bytes_per_s = (copier.bytes - bytes_before) as f64 / took;
        self.expected_downtime_ms = (dirty * PAGE) as f64 / self.bytes_per_s.max(1.0) * 1e3;
        self.elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    }
}

/// The machine's own [`SendMigration`]: its snapshotter, and where its migration stands.
pub struct Sender {
    snapshotter: Arc<Snapshotter>,
    progress: ProgressSlot,
}

impl Sender {
    /// The sender of the machine `snapshotter` saves.
    pub fn new(snapshotter: Arc<Snapshotter>) -> Self {
        Sender {
            snapshotter,
            progress: Mutex::default(),
        }
    }
}

impl SendMigration for Sender {
    fn send(&self, options: &MigrationOptions) -> Result<Migrated, MigrationError> {
        self.snapshotter.migrate(options, &self.progress)
    }

    fn progress(&self) -> Option<Progress> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
