//! The target's side: one source accepted, its stream read into a new machine's RAM, the
//! machine built and its state set once the stream is whole, `Ready` answered, and the
//! machine run once the source says `Go`. Anything wrong in the stream (another exitless, a
//! record out of place, pages outside RAM, a checksum that does not match, a stream cut short)
//! refuses the machine before any vCPU runs, and tells the source, which goes on.

use std::io::{BufReader, BufWriter, Chain, Cursor, Read, Write};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, Permissions};

use crate::machine::migration::address::{Listener, Stream};
use crate::machine::migration::local::{self, Handed};
use crate::machine::migration::send::{ConfigRecord, StateRecord};
use crate::machine::migration::stream::{Counted, PAGE, PREFACE_LEN, Record, read_preface};
use crate::machine::migration::{MigrationError, StreamError};
use crate::machine::snapshot::{SnapshotError, check_config};
use crate::machine::vcpus::Vcpus;
use crate::machine::wiring::files::FileSource;
use crate::machine::{Machine, MachineConfig, Ram};

/// Longest the source may be silent: between two records, and between `Ready` and `Go`.
const SOURCE_DEADLINE: Duration = Duration::from_secs(60);

/// The stream as the target reads it: the first bytes (read with any files handed over),
/// then the rest.
type Input = BufReader<Counted<Chain<Cursor<Vec<u8>>, Stream>>>;

/// A machine received from a source: built, its state set, waiting for the source's `Go`.
pub struct Incoming {
    /// The machine.
    pub machine: Machine,
    /// Its vCPUs, their state set, for [`Machine::run_vcpus`].
    pub vcpus: Vcpus,
    /// The source's user had paused it: it stays paused.
    pub paused: bool,
    /// What the target measured of it.
    pub arrival: Arrival,
    input: Input,
}

/// What a target measured of a machine coming in.
#[derive(Clone, Copy, Debug, Default)]
pub struct Arrival {
    /// Bytes of the stream, up to its end.
    pub bytes: u64,
    /// Files the source handed over (a live update): guest RAM, disk images, tap queues.
    pub files: usize,
    /// From the source's connection to the stream's end.
    pub stream: Duration,
    /// From the stream's end to the machine built, its state set: the target's part of the
    /// downtime before it answers.
    pub build: Duration,
    /// From the answer to the source's go-ahead.
    pub go: Duration,
}

impl std::fmt::Display for Arrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.files > 0 {
            write!(f, "its RAM and {} files handed over, ", self.files - 1)?;
        }
        write!(
            f,
            "{} bytes in {:.1} ms, the machine built in {:.1} ms, the go-ahead {:.2} ms after",
            self.bytes,
            self.stream.as_secs_f64() * 1e3,
            self.build.as_secs_f64() * 1e3,
            self.go.as_secs_f64() * 1e3
        )
    }
}

impl Incoming {
    /// Take one source's machine from `listener`, its configuration changed by `adapt`
    /// (where the console goes is this host's choice). On a refusal the source is told why.
    pub fn accept(
        listener: &Listener,
        adapt: impl FnOnce(&mut MachineConfig),
    ) -> Result<Self, MigrationError> {
        let stream = listener.accept().map_err(StreamError::from)?;
        stream
            .set_timeouts(SOURCE_DEADLINE)
            .map_err(StreamError::from)?;
        let mut answer = BufWriter::new(stream.try_clone().map_err(StreamError::from)?);
        // A live update's files come with the first bytes, which must be read with them.
        let (first, handed) = match &stream {
            Stream::Unix(s) => local::receive_first(s, PREFACE_LEN).map_err(StreamError::from)?,
            Stream::Tcp(_) => (Vec::new(), None),
        };
        let mut input = BufReader::new(Counted::new(Cursor::new(first).chain(stream)));
        let mut arrival = Arrival {
            files: handed.as_ref().map_or(0, |h| 1 + h.files.len()),
            ..Arrival::default()
        };
        match Self::receive(&mut input, &mut answer, adapt, handed, &mut arrival) {
            Ok((machine, vcpus, paused)) => {
                Record::Ready
                    .write_to(&mut answer)
                    .and_then(|()| answer.flush())
                    .map_err(StreamError::from)?;
                Ok(Incoming {
                    machine,
                    vcpus,
                    paused,
                    arrival,
                    input,
                })
            }
            Err(e) => {
                // Best effort: a source that is gone learns nothing, and needs nothing.
                let refused = Record::Refused(e.to_string());
                let _ = refused.write_to(&mut answer).and_then(|()| answer.flush());
                Err(e)
            }
        }
    }

    /// Wait for the source to hand the machine over, then let its devices go on: until the
    /// source's `Go` they do nothing (the source may yet take the VM back, and on this host
    /// its tap, images and memory may be the same).
    pub fn wait_for_go(&mut self) -> Result<(), MigrationError> {
        let answered = Instant::now();
        match Record::read_from(&mut self.input) {
            Ok(Record::Go) => {
                self.arrival.go = answered.elapsed();
                self.machine.resume_devices();
                Ok(())
            }
            Ok(other) => Err(MigrationError::Order(format!("{other:?} for the go-ahead"))),
            Err(e) => Err(MigrationError::Order(format!(
                "the source did not hand the VM over ({e}); it keeps it"
            ))),
        }
    }

    /// Read the stream into a new machine's RAM; build the machine and set its state once
    /// it is whole, noting the times in `arrival`.
    fn receive(
        input: &mut Input,
        answer: &mut BufWriter<Stream>,
        adapt: impl FnOnce(&mut MachineConfig),
        handed: Option<Handed>,
        arrival: &mut Arrival,
    ) -> Result<(Machine, Vcpus, bool), MigrationError> {
        let start = Instant::now();
        let mut adapt = Some(adapt);
        let mut files = FileSource::default();
        let received = read_stream(input, |cfg| {
            if let Some(adapt) = adapt.take() {
                adapt(cfg);
            }
            let ram = match handed {
                Some(handed) => {
                    let (ram, host) = handed.into_machine_parts(cfg)?;
                    files = FileSource::handed(host);
                    ram
                }
                None => Ram::new(cfg, None).map_err(Box::new)?,
            };
            Record::Accepted
                .write_to(answer)
                .and_then(|()| answer.flush())
                .map_err(StreamError::from)?;
            Ok(ram)
        })?;
        let ended = Instant::now();
        (arrival.bytes, arrival.stream) = (input.get_ref().bytes, ended - start);
        let Received { config, ram, state } = received;
        let machine = Machine::assemble(&config, None, ram, files).map_err(Box::new)?;
        let (vcpus, _) = machine.set_state(state.state.as_ref()).map_err(Box::new)?;
        arrival.build = ended.elapsed();
        Ok((machine, vcpus, state.paused))
    }
}

/// Guest RAM a stream's pages are written into: a machine's, or a test's.
pub trait GuestRam {
    /// The memory.
    fn memory(&self) -> &GuestMemoryMmap;

    /// Whether the source handed it over (a live update): no page may come for it, since
    /// until `Go` it is the source's running guest's.
    fn handed_over(&self) -> bool {
        false
    }
}

impl GuestRam for Ram {
    fn memory(&self) -> &GuestMemoryMmap {
        Ram::memory(self)
    }

    fn handed_over(&self) -> bool {
        Ram::handed_over(self)
    }
}

impl GuestRam for GuestMemoryMmap {
    fn memory(&self) -> &GuestMemoryMmap {
        self
    }
}

/// What a whole stream held: the machine's configuration, its RAM as the pages left it, and
/// its state.
pub struct Received<R> {
    /// The configuration, as checked and changed by the caller.
    pub config: MachineConfig,
    /// RAM, every page the stream sent written.
    pub ram: R,
    /// The paused machine's state, checked against the configuration.
    pub state: StateRecord,
}

/// Read a stream up to its `End`: the preface, the configuration (checked, then given to
/// `make_ram`, which may change it and makes RAM for it), pages into that RAM as they come,
/// the state. Every record is checked before it is believed.
pub fn read_stream<R: GuestRam>(
    input: &mut impl Read,
    make_ram: impl FnOnce(&mut MachineConfig) -> Result<R, MigrationError>,
) -> Result<Received<R>, MigrationError> {
    read_preface(input)?;
    let Record::Config(json) = Record::read_from(input)? else {
        return Err(MigrationError::Order("no configuration first".into()));
    };
    let sent: ConfigRecord = serde_json::from_slice(&json).map_err(SnapshotError::Content)?;
    if sent.exitless_version != env!("CARGO_PKG_VERSION") {
        return Err(SnapshotError::ExitlessVersion(sent.exitless_version).into());
    }
    let mut config = sent.config;
    check_config(&config)?;
    let ram = make_ram(&mut config)?;
    let mut state: Option<StateRecord> = None;
    loop {
        match Record::read_from(input)? {
            Record::Pages { .. } | Record::Zeros { .. } if ram.handed_over() => {
                let why = "pages sent for guest RAM handed over (a live update sends none)";
                return Err(MigrationError::Order(why.into()));
            }
            Record::Pages { gpa, data } => write_pages(&ram, gpa, &data)?,
            Record::Zeros { gpa, pages } => {
                let zero = [0; PAGE];
                check_pages(&ram, gpa, pages.saturating_mul(PAGE as u64))?;
                for page in 0..pages {
                    write_pages(&ram, gpa + page * PAGE as u64, &zero)?;
                }
            }
            Record::State(json) => {
                let record: StateRecord =
                    serde_json::from_slice(&json).map_err(SnapshotError::Content)?;
                record.state.as_ref().check(&config)?;
                state = Some(record);
            }
            Record::End => break,
            other => return Err(MigrationError::Order(format!("{other:?} from the source"))),
        }
    }
    let state = state.ok_or_else(|| MigrationError::Order("no state before the end".into()))?;
    Ok(Received { config, ram, state })
}

/// `len` bytes at `gpa` are all guest RAM.
fn check_pages(ram: &impl GuestRam, gpa: u64, len: u64) -> Result<(), MigrationError> {
    let inside = usize::try_from(len).is_ok_and(|len| {
        len > 0
            && ram
                .memory()
                .check_range(GuestAddress(gpa), len, Permissions::Write)
    });
    if inside {
        Ok(())
    } else {
        let why = format!("{len} bytes of pages at {gpa:#x}, outside guest RAM");
        Err(StreamError::Corrupt(why).into())
    }
}

fn write_pages(ram: &impl GuestRam, gpa: u64, data: &[u8]) -> Result<(), MigrationError> {
    check_pages(ram, gpa, data.len() as u64)?;
    ram.memory()
        .write_slice(data, GuestAddress(gpa))
        .map_err(|e| StreamError::Corrupt(format!("pages at {gpa:#x}: {e}")).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::migration::stream::write_preface;

    /// Guest RAM handed over by a live update's source.
    struct HandedRam(GuestMemoryMmap);

    impl GuestRam for HandedRam {
        fn memory(&self) -> &GuestMemoryMmap {
            &self.0
        }

        fn handed_over(&self) -> bool {
            true
        }
    }

    #[test]
    fn pages_for_guest_ram_handed_over_are_refused() {
        let mut stream = Vec::new();
        write_preface(&mut stream).unwrap();
        let config = ConfigRecord {
            exitless_version: env!("CARGO_PKG_VERSION").into(),
            config: MachineConfig::default(),
        };
        Record::Config(serde_json::to_vec(&config).unwrap())
            .write_to(&mut stream)
            .unwrap();
        let pages = [
            Record::Pages {
                gpa: 0,
                data: vec![7; PAGE],
            },
            Record::Zeros { gpa: 0, pages: 1 },
        ];
        for page in pages {
            let mut input = stream.clone();
            page.write_to(&mut input).unwrap();
            let read = read_stream(&mut &input[..], |cfg| {
                let ram = vec![(GuestAddress(0), cfg.ram_size)];
                Ok(HandedRam(GuestMemoryMmap::from_ranges(&ram).unwrap()))
            });
            let Err(e) = read else {
                panic!("pages taken for RAM handed over");
            };
            assert!(e.to_string().contains("a live update sends none"), "{e}");
        }
    }
}
