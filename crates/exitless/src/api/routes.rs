//! The API's endpoints, in Cloud Hypervisor's style (`/api/v1/vm.<action>`): what each answers
//! from the machine's view, and the errors of a request no endpoint takes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::http::{Request, Response};
use crate::exits::ExitKind;
use crate::logging::QueueTotals;
use crate::machine::MachineView;
use crate::machine::migration::{
    DEFAULT_DOWNTIME, Migrated, MigrationError, MigrationOptions, Progress,
};
use crate::machine::snapshot::SnapshotError;
use crate::vm::pause::PauseError;
use crate::vm::run_control::StopReason;

/// The prefix of every endpoint.
pub const PREFIX: &str = "/api/v1/";

/// Longest `vm.pause` waits for every vCPU to park: a vCPU stuck outside the guest (in a
/// device) is not kicked out by a signal, as at stop (`machine::vcpus`).
pub const PAUSE_DEADLINE: Duration = Duration::from_secs(5);

/// An endpoint, and the method it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET vm.info`: what the machine is and its state.
    Info,
    /// `GET vm.counters`: the exit accounting.
    Counters,
    /// `PUT vm.pause`.
    Pause,
    /// `PUT vm.resume`.
    Resume,
    /// `PUT vm.shutdown`: the run ends, `exitless run` exits 0.
    Shutdown,
    /// `PUT vm.snapshot {"destination": DIR}`: the machine saved into DIR.
    Snapshot,
    /// `PUT vm.send-migration {"destination_url": ADDRESS, "downtime_ms": N}`: the machine
    /// sent to the exitless waiting at ADDRESS; this run ends once it is there.
    SendMigration,
}

impl Endpoint {
    /// Every endpoint.
    pub const ALL: [Endpoint; 7] = [
        Endpoint::Info,
        Endpoint::Counters,
        Endpoint::Pause,
        Endpoint::Resume,
        Endpoint::Shutdown,
        Endpoint::Snapshot,
        Endpoint::SendMigration,
    ];

    /// Its name after [`PREFIX`].
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Info => "vm.info",
            Endpoint::Counters => "vm.counters",
            Endpoint::Pause => "vm.pause",
            Endpoint::Resume => "vm.resume",
            Endpoint::Shutdown => "vm.shutdown",
            Endpoint::Snapshot => "vm.snapshot",
            Endpoint::SendMigration => "vm.send-migration",
        }
    }

    /// The method it takes: GET for what only reads, PUT for what acts (as Cloud Hypervisor).
    pub fn method(self) -> &'static str {
        match self {
            Endpoint::Info | Endpoint::Counters => "GET",
            Endpoint::Pause
            | Endpoint::Resume
            | Endpoint::Shutdown
            | Endpoint::Snapshot
            | Endpoint::SendMigration => "PUT",
        }
    }
}

/// `vm.info`'s answer.
#[derive(Serialize)]
struct Info<'a> {
    /// `running`, `paused`, or `asleep` (the guest entered ACPI S3).
    state: &'static str,
    vcpus: u8,
    memory_bytes: u64,
    devices: &'a [String],
    version: &'static str,
    /// The migration under way, if one is (`vm.send-migration`).
    #[serde(skip_serializing_if = "Option::is_none")]
    migration: Option<Progress>,
}

/// The answer of an action: the state it left the machine in.
#[derive(Serialize)]
struct State {
    state: &'static str,
}

/// `vm.snapshot`'s body.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// The directory to save into, made if absent.
    pub destination: PathBuf,
}

/// `vm.snapshot`'s answer: where it went, and the state it left the machine in.
#[derive(Serialize)]
struct Taken<'a> {
    state: &'static str,
    destination: &'a Path,
}

/// `vm.send-migration`'s body.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationRequest {
    /// Where the target waits: `tcp:IP:PORT` or `unix:PATH`.
    pub destination_url: String,
    /// The downtime to aim for, in milliseconds (default: 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<u64>,
}

/// One device's line of `vm.counters`.
#[derive(Serialize)]
struct DeviceCounters {
    exits: u64,
    guest_errors: u64,
    /// What each queue exitless serves carried, by queue index (left out for devices with
    /// none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    queues: Vec<QueueTotals>,
}

/// `vm.counters`' answer: every exit so far, by kind and by device.
#[derive(Serialize)]
struct Counters {
    total: u64,
    by_kind: BTreeMap<&'static str, u64>,
    /// Devices with exits or guest errors; "no device" counts accesses nothing claims.
    by_device: BTreeMap<String, DeviceCounters>,
}

fn state(view: &MachineView) -> &'static str {
    let control = &view.control;
    if control.pause().paused() {
        "paused"
    } else if control.sleep().asleep() {
        "asleep"
    } else {
        "running"
    }
}

fn info(view: &MachineView) -> Response {
    Response::json(
        200,
        &Info {
            state: state(view),
            vcpus: view.vcpus,
            memory_bytes: view.ram_bytes,
            devices: &view.devices,
            version: env!("CARGO_PKG_VERSION"),
            migration: view.migrate.progress(),
        },
    )
}

fn counters(view: &MachineView) -> Response {
    let snapshot = view.counters.snapshot();
    let by_kind = ExitKind::ALL
        .into_iter()
        .map(|kind| (kind.name(), snapshot.of_kind(kind)))
        .collect();
    let by_device = (0..snapshot.by_device.len())
        .map(|id| {
            let name = view.devices.get(id).map_or("no device", String::as_str);
            let line = DeviceCounters {
                exits: snapshot.of_device(id),
                guest_errors: snapshot.guest_errors_of(id),
                queues: view.counters.queue_totals(id),
            };
            (name.to_owned(), line)
        })
        .filter(|(_, line)| line.exits != 0 || line.guest_errors != 0 || !line.queues.is_empty())
        .collect();
    Response::json(
        200,
        &Counters {
            total: snapshot.total(),
            by_kind,
            by_device,
        },
    )
}

/// The status of a refused pause or resume.
fn pause_status(e: &PauseError) -> u16 {
    match e {
        PauseError::AlreadyPaused | PauseError::NotPaused => 400,
        PauseError::Asleep => 409,
        PauseError::Stopping => 503,
        PauseError::TimedOut(_) | PauseError::Capture { .. } => 500,
    }
}

fn acted(result: Result<(), PauseError>, state: &'static str) -> Response {
    match result {
        Ok(()) => Response::json(200, &State { state }),
        Err(e) => Response::error(pause_status(&e), &e.to_string()),
    }
}

/// The status of a snapshot not taken: a destination that cannot be written is the client's
/// to fix; anything else is the VMM's failure.
fn snapshot_status(e: &SnapshotError) -> u16 {
    match e {
        SnapshotError::Io { .. } => 400,
        _ => 500,
    }
}

/// `vm.snapshot`: a running machine is paused for it and goes on after, a paused one stays
/// paused (Cloud Hypervisor's and QEMU's way: a paused VM is snapshotted as it is). Whatever
/// happens to the snapshot, the VM goes on as it was.
fn snapshot(request: &Request, view: &MachineView) -> Response {
    let asked: SnapshotRequest = match serde_json::from_slice(&request.body) {
        Ok(asked) => asked,
        Err(e) => {
            let why = format!("vm.snapshot takes {{\"destination\": DIR}}: {e}");
            return Response::error(400, &why);
        }
    };
    // A relative path would be the VMM's working directory's, which the client cannot know.
    if !asked.destination.is_absolute() {
        let why = format!(
            "vm.snapshot takes {{\"destination\": DIR}} with DIR an absolute path, not {:?}",
            asked.destination
        );
        return Response::error(400, &why);
    }
    let control = &view.control;
    let running = !control.pause().paused();
    if running && let Err(e) = control.pause_vcpus(PAUSE_DEADLINE) {
        return Response::error(pause_status(&e), &e.to_string());
    }
    let taken = view.snapshot.take(&asked.destination);
    if running {
        // Paused here, by this thread, which serves one request at a time: it resumes.
        let _ = control.pause().resume();
    }
    match taken {
        Ok(()) => Response::json(
            200,
            &Taken {
                state: if running { "running" } else { "paused" },
                destination: &asked.destination,
            },
        ),
        Err(e) => Response::error(snapshot_status(&e), &e.to_string()),
    }
}

/// The status of a migration that failed: an address or a target that is wrong is the
/// client's to fix; anything else is the VMM's failure. The machine goes on either way.
fn migration_status(e: &MigrationError) -> u16 {
    match e {
        MigrationError::Address(_)
        | MigrationError::Connect { .. }
        | MigrationError::Refused(_)
        | MigrationError::Unsupported(_)
        | MigrationError::Stream(_) => 400,
        MigrationError::Pause(e) => pause_status(e),
        _ => 500,
    }
}

/// `vm.send-migration`: the machine is to be sent while it runs (a paused one stays paused
/// there), as the options say; or the answer to a request that cannot be.
fn send_migration(request: &Request) -> Reply {
    let asked: MigrationRequest = match serde_json::from_slice(&request.body) {
        Ok(asked) => asked,
        Err(e) => {
            let why = format!(
                "vm.send-migration takes {{\"destination_url\": ADDRESS, \"downtime_ms\": N}}: {e}"
            );
            return Reply::Now(Response::error(400, &why));
        }
    };
    let address = match asked.destination_url.parse() {
        Ok(address) => address,
        Err(e) => return Reply::Now(Response::error(400, &format!("{e}"))),
    };
    Reply::Migrate(MigrationOptions {
        address,
        downtime: asked
            .downtime_ms
            .map_or(DEFAULT_DOWNTIME, Duration::from_millis),
        pause_deadline: PAUSE_DEADLINE,
    })
}

/// The answer to `vm.send-migration` once the migration to `to` ended: what was measured
/// once the target has the machine, or why not, the machine going on here as it was.
pub fn migration_answer(to: &str, sent: Result<Migrated, MigrationError>) -> Response {
    match sent {
        Ok(migrated) => Response::json(200, &migrated),
        Err(e) => {
            log::warn!("migration to {to}: {e}");
            Response::error(migration_status(&e), &e.to_string())
        }
    }
}

/// What the server does with a request.
#[derive(Debug)]
pub enum Reply {
    /// Answer this.
    Now(Response),
    /// Send the machine as these options say, on the migration's own thread, and answer
    /// with [`migration_answer`] once it has ended; meanwhile other requests are answered.
    Migrate(MigrationOptions),
}

/// Do what `request` (asking `endpoint`) asks of the machine, and answer.
fn serve(endpoint: Endpoint, request: &Request, view: &MachineView) -> Reply {
    let control = &view.control;
    let now = match endpoint {
        Endpoint::Info => info(view),
        Endpoint::Counters => counters(view),
        Endpoint::Pause => acted(control.pause_vcpus(PAUSE_DEADLINE), "paused"),
        Endpoint::Resume => acted(control.pause().resume(), "running"),
        Endpoint::Shutdown => {
            // Parked vCPUs see the stop too: a paused machine shuts down as well.
            control.stop(StopReason::Requested);
            Response::json(
                200,
                &State {
                    state: "shutting down",
                },
            )
        }
        Endpoint::Snapshot => snapshot(request, view),
        Endpoint::SendMigration => return send_migration(request),
    };
    Reply::Now(now)
}

/// What to do with `request`: the endpoint's answer, or 404 for an unknown path, 405 for a
/// known one asked with another method. While a migration is under way (`migrating`), only
/// what reads is answered; what acts is 409: the migration pauses and resumes the machine
/// itself, and ends its run.
pub fn answer(request: &Request, view: &MachineView, migrating: bool) -> Reply {
    let name = request.path.strip_prefix(PREFIX);
    let Some(endpoint) = Endpoint::ALL.into_iter().find(|e| Some(e.name()) == name) else {
        return Reply::Now(Response::error(
            404,
            &format!("no endpoint {}", request.path),
        ));
    };
    if request.method != endpoint.method() {
        return Reply::Now(Response::error(
            405,
            &format!(
                "{} takes {}, not {}",
                request.path,
                endpoint.method(),
                request.method
            ),
        ));
    }
    if migrating && endpoint.method() != "GET" {
        return Reply::Now(Response::error(
            409,
            &format!(
                "a migration is under way (vm.info shows where it stands): {} waits until it has failed",
                endpoint.name()
            ),
        ));
    }
    serve(endpoint, request, view)
}

#[cfg(test)]
mod tests;
