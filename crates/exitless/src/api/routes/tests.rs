use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use super::*;
use crate::exits::{ExitCounters, ExitKind};
use crate::logging::{Cause, DeviceLog, Tally};
use crate::machine::migration::{Migrated, SendMigration};
use crate::machine::snapshot::TakeSnapshot;
use crate::vm::run_control::RunControl;

/// A machine's snapshotter as the API sees it: it records where it saved, and whether the
/// machine was paused then; a destination under /proc cannot be written.
struct Recorder {
    control: Arc<RunControl>,
    taken: Mutex<Vec<(PathBuf, bool)>>,
    /// Each migration asked: where to, and the downtime aimed for.
    sent: Mutex<Vec<(String, Duration)>>,
    /// What `progress` says.
    progress: Mutex<Option<Progress>>,
}

/// A migration to `unix:/refused` is refused by its target; any other is done.
impl SendMigration for Recorder {
    fn send(&self, options: &MigrationOptions) -> Result<Migrated, MigrationError> {
        let to = options.address.to_string();
        self.sent
            .lock()
            .unwrap()
            .push((to.clone(), options.downtime));
        if to == "unix:/refused" {
            return Err(MigrationError::Refused("no room".into()));
        }
        Ok(Migrated {
            passes: 2,
            ..Migrated::default()
        })
    }

    fn progress(&self) -> Option<Progress> {
        self.progress.lock().unwrap().clone()
    }
}

impl TakeSnapshot for Recorder {
    fn take(&self, dir: &Path) -> Result<(), SnapshotError> {
        let paused = self.control.pause().paused();
        self.taken.lock().unwrap().push((dir.to_owned(), paused));
        if dir.starts_with("/proc") {
            let source = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
            return Err(SnapshotError::Io {
                what: "make the directory",
                path: dir.to_owned(),
                source,
            });
        }
        Ok(())
    }
}

fn view_with(vcpus: u8) -> (MachineView, Arc<Recorder>) {
    let control = Arc::new(RunControl::default());
    control.set_vcpus(vcpus);
    let recorder = Arc::new(Recorder {
        control: control.clone(),
        taken: Mutex::default(),
        sent: Mutex::default(),
        progress: Mutex::default(),
    });
    let view = MachineView {
        control,
        counters: Arc::new(ExitCounters::new(2)),
        devices: vec!["serial".into(), "rtc".into()],
        vcpus,
        ram_bytes: 128 << 20,
        snapshot: recorder.clone(),
        migrate: recorder.clone(),
    };
    (view, recorder)
}

fn view(vcpus: u8) -> MachineView {
    view_with(vcpus).0
}

fn ask(view: &MachineView, method: &str, name: &str) -> (u16, serde_json::Value) {
    ask_with(view, method, name, b"")
}

fn ask_with(view: &MachineView, method: &str, name: &str, body: &[u8]) -> (u16, serde_json::Value) {
    ask_while(view, method, name, body, false)
}

/// The answer to a request, `migrating` or not; a migration asked is sent at once, as the
/// migration's thread does.
fn ask_while(
    view: &MachineView,
    method: &str,
    name: &str,
    body: &[u8],
    migrating: bool,
) -> (u16, serde_json::Value) {
    let request = Request {
        method: method.into(),
        path: format!("{PREFIX}{name}"),
        body: body.to_vec(),
    };
    let response = match answer(&request, view, migrating) {
        Reply::Now(response) => response,
        Reply::Migrate(options) => {
            migration_answer(&options.address.to_string(), view.migrate.send(&options))
        }
    };
    (
        response.status,
        serde_json::from_str(&response.body).unwrap(),
    )
}

/// A stand-in for a vCPU thread's loop: it parks whenever asked, until `done`.
fn vcpu_loop(control: Arc<RunControl>, done: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !done.load(Ordering::Acquire) && !control.is_stopping() {
            if control.pause().must_park() {
                control.pause().park(
                    0,
                    || control.is_stopping(),
                    || unreachable!("the API's tests take no vCPU state"),
                );
            }
            thread::yield_now();
        }
    })
}

#[test]
fn info_says_what_the_machine_is_and_its_state() {
    let view = view(1);
    let (status, info) = ask(&view, "GET", "vm.info");
    assert_eq!(status, 200);
    assert_eq!(info["state"], "running");
    assert_eq!(info["vcpus"], 1);
    assert_eq!(info["memory_bytes"], 128 << 20);
    assert_eq!(info["devices"][1], "rtc");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn counters_are_the_exit_accounting_by_kind_and_device() {
    let view = view(1);
    view.counters.record(ExitKind::PioWrite, Some(0));
    view.counters.record(ExitKind::PioWrite, Some(0));
    view.counters.record(ExitKind::MmioRead, None);
    let (status, counters) = ask(&view, "GET", "vm.counters");
    assert_eq!(status, 200);
    assert_eq!(counters["total"], 3);
    assert_eq!(counters["by_kind"]["pio-write"], 2);
    assert_eq!(counters["by_device"]["serial"]["exits"], 2);
    assert_eq!(counters["by_device"]["no device"]["exits"], 1);
    assert!(counters["by_device"].get("rtc").is_none(), "no exits there");
}

#[test]
fn counters_show_what_each_served_queue_carried() {
    let view = view(1);
    let log = DeviceLog::new("rtc");
    assert!(view.counters.attach_log(1, log.clone()));
    log.queue_counters(1).add(&Tally {
        completed: 3,
        bytes_read: 48,
        bytes_written: 1539,
        iommu_faults: 0,
    });
    log.queue_counters(1).error(Cause::Backend);
    let (_, counters) = ask(&view, "GET", "vm.counters");
    let queues = &counters["by_device"]["rtc"]["queues"];
    assert_eq!(queues.as_array().map(Vec::len), Some(2), "{counters}");
    assert_eq!(queues[0]["completed"], 0, "queue 0, never served");
    assert_eq!(queues[1]["completed"], 3);
    assert_eq!(queues[1]["bytes_read"], 48);
    assert_eq!(queues[1]["bytes_written"], 1539);
    let errors = &queues[1]["errors"];
    assert_eq!(
        (&errors["guest"], &errors["backend"]),
        (&0.into(), &1.into())
    );
    assert_eq!(
        counters["by_device"]["rtc"]["exits"], 0,
        "a line without exits"
    );
    assert!(
        counters["by_device"]["serial"].get("queues").is_none(),
        "{counters}"
    );
}

#[test]
fn pause_answers_once_parked_and_pause_twice_or_resume_while_running_is_400() {
    let view = view(2);
    let done = Arc::new(AtomicBool::new(false));
    let vcpus: Vec<_> = (0..2)
        .map(|_| vcpu_loop(view.control.clone(), done.clone()))
        .collect();
    let (status, body) = ask(&view, "PUT", "vm.resume");
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("the VM is not paused"))
    );
    let (status, body) = ask(&view, "PUT", "vm.pause");
    assert_eq!(
        (status, &body["state"]),
        (200, &serde_json::json!("paused"))
    );
    assert!(view.control.pause().paused(), "every vCPU parked");
    assert_eq!(ask(&view, "GET", "vm.info").1["state"], "paused");
    let (status, body) = ask(&view, "PUT", "vm.pause");
    assert_eq!(status, 400);
    assert_eq!(body["error"], "the VM is already paused");
    assert_eq!(ask(&view, "PUT", "vm.resume").0, 200);
    assert_eq!(ask(&view, "GET", "vm.info").1["state"], "running");
    done.store(true, Ordering::Release);
    for v in vcpus {
        v.join().unwrap();
    }
}

#[test]
fn shutdown_stops_the_run_even_while_paused() {
    let view = view(1);
    let vcpu = vcpu_loop(view.control.clone(), Arc::new(AtomicBool::new(false)));
    assert_eq!(ask(&view, "PUT", "vm.pause").0, 200);
    assert_eq!(ask(&view, "PUT", "vm.shutdown").0, 200);
    vcpu.join().unwrap();
    assert_eq!(
        view.control.wait(Duration::ZERO),
        Some(StopReason::Requested)
    );
    let (status, _) = ask(&view, "PUT", "vm.pause");
    assert_eq!(status, 503, "nothing to pause any more");
}

#[test]
fn unknown_paths_are_404_and_wrong_methods_405() {
    let view = view(1);
    assert_eq!(ask(&view, "GET", "vm.reboot").0, 404);
    assert_eq!(ask(&view, "GET", "../vm.info").0, 404);
    let (status, body) = ask(&view, "GET", "vm.pause");
    assert_eq!(status, 405);
    assert_eq!(body["error"], "/api/v1/vm.pause takes PUT, not GET");
    assert_eq!(ask(&view, "DELETE", "vm.info").0, 405);
    assert!(!view.control.is_stopping());
}

#[test]
fn a_snapshot_pauses_a_running_vm_for_its_time_and_leaves_a_paused_one_paused() {
    let (view, recorder) = view_with(1);
    let done = Arc::new(AtomicBool::new(false));
    let vcpu = vcpu_loop(view.control.clone(), done.clone());
    let body = br#"{"destination": "/tmp/snap-a"}"#;
    let (status, answer) = ask_with(&view, "PUT", "vm.snapshot", body);
    assert_eq!((status, &answer["state"]), (200, &"running".into()));
    assert_eq!(answer["destination"], "/tmp/snap-a");
    assert_eq!(ask(&view, "GET", "vm.info").1["state"], "running");
    assert_eq!(ask(&view, "PUT", "vm.pause").0, 200);
    let (status, answer) = ask_with(&view, "PUT", "vm.snapshot", body);
    assert_eq!((status, &answer["state"]), (200, &"paused".into()));
    assert!(view.control.pause().paused(), "still paused");
    let taken = recorder.taken.lock().unwrap().clone();
    assert_eq!(
        taken,
        [("/tmp/snap-a".into(), true), ("/tmp/snap-a".into(), true)]
    );
    assert_eq!(ask(&view, "PUT", "vm.resume").0, 200);
    done.store(true, Ordering::Release);
    vcpu.join().unwrap();
}

#[test]
fn an_unwritable_destination_or_a_bad_body_is_an_error_and_the_vm_goes_on() {
    let (view, recorder) = view_with(1);
    let done = Arc::new(AtomicBool::new(false));
    let vcpu = vcpu_loop(view.control.clone(), done.clone());
    let body = br#"{"destination": "/proc/snap"}"#;
    let (status, answer) = ask_with(&view, "PUT", "vm.snapshot", body);
    assert_eq!(status, 400);
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.starts_with("cannot make the directory /proc/snap"),
        "{error}"
    );
    assert_eq!(ask(&view, "GET", "vm.info").1["state"], "running");
    for bad in [
        &b""[..],
        b"{}",
        b"{\"destination\": 5}",
        b"{\"dest\": \"/tmp\"}",
        b"\xff",
    ] {
        let (status, answer) = ask_with(&view, "PUT", "vm.snapshot", bad);
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(bad));
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .starts_with("vm.snapshot takes")
        );
    }
    // Nothing but an absolute path: an empty or relative one would land in the VMM's working
    // directory.
    for relative in ["", "snap", "./snap", "../snap"] {
        let body = format!("{{\"destination\": {relative:?}}}");
        let (status, answer) = ask_with(&view, "PUT", "vm.snapshot", body.as_bytes());
        assert_eq!(status, 400, "{relative:?}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains("an absolute path"), "{error}");
    }
    assert_eq!(ask(&view, "GET", "vm.snapshot").0, 405);
    assert_eq!(
        recorder.taken.lock().unwrap().len(),
        1,
        "bad requests take nothing"
    );
    assert_eq!(ask(&view, "GET", "vm.info").1["state"], "running");
    done.store(true, Ordering::Release);
    vcpu.join().unwrap();
}

#[test]
fn a_migration_is_asked_with_its_address_and_downtime_and_answered_with_its_figures() {
    let (view, recorder) = view_with(1);
    let ask = |body: &str| ask_with(&view, "PUT", "vm.send-migration", body.as_bytes());
    let (status, answer) = ask(r#"{"destination_url": "tcp:127.0.0.1:4444"}"#);
    assert_eq!((status, &answer["passes"]), (200, &serde_json::json!(2)));
    let (status, _) = ask(r#"{"destination_url": "unix:/x", "downtime_ms": 50}"#);
    assert_eq!(status, 200);
    let (status, answer) = ask(r#"{"destination_url": "unix:/refused"}"#);
    assert_eq!(status, 400);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("refused the VM: no room")
    );
    // Neither a bad address nor a bad body reaches the machine.
    let (status, answer) = ask(r#"{"destination_url": "tcp:localhost"}"#);
    assert_eq!(status, 400);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("tcp:HOST:PORT, unix:PATH or local:PATH")
    );
    let (status, _) = ask(r#"{"destination": "unix:/x"}"#);
    assert_eq!(status, 400);
    assert_eq!(
        *recorder.sent.lock().unwrap(),
        [
            ("tcp:127.0.0.1:4444".into(), DEFAULT_DOWNTIME),
            ("unix:/x".into(), Duration::from_millis(50)),
            ("unix:/refused".into(), DEFAULT_DOWNTIME),
        ]
    );
}

#[test]
fn while_a_migration_is_under_way_info_says_where_it_stands_and_actions_are_409() {
    let (view, recorder) = view_with(1);
    assert!(ask(&view, "GET", "vm.info").1.get("migration").is_none());
    *recorder.progress.lock().unwrap() = Some(Progress {
        phase: "copying",
        pass: 3,
        dirty_pages: 12,
        ..Progress::default()
    });
    let (status, info) = ask_while(&view, "GET", "vm.info", b"", true);
    assert_eq!(status, 200);
    assert_eq!(info["migration"]["phase"], "copying");
    assert_eq!(info["migration"]["pass"], 3);
    assert_eq!(info["migration"]["dirty_pages"], 12);
    assert_eq!(ask_while(&view, "GET", "vm.counters", b"", true).0, 200);
    for name in ["vm.pause", "vm.resume", "vm.shutdown"] {
        let (status, answer) = ask_while(&view, "PUT", name, b"", true);
        assert_eq!(status, 409, "{name}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .contains("a migration is under way"),
            "{answer}"
        );
    }
    let body = br#"{"destination_url": "unix:/x"}"#;
    assert_eq!(
        ask_while(&view, "PUT", "vm.send-migration", body, true).0,
        409
    );
    assert!(recorder.sent.lock().unwrap().is_empty());
    assert!(!view.control.is_stopping());
}
