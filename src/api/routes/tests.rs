use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use super::*;
use crate::stats::{ExitCounters, ExitKind};
use crate::vm::run_control::RunControl;

fn view(vcpus: u8) -> MachineView {
    let control = Arc::new(RunControl::default());
    control.set_vcpus(vcpus);
    MachineView {
        control,
        counters: Arc::new(ExitCounters::new(2)),
        devices: vec!["serial".into(), "rtc".into()],
        vcpus,
        ram_bytes: 128 << 20,
    }
}

fn ask(view: &MachineView, method: &str, name: &str) -> (u16, serde_json::Value) {
    let request = Request {
        method: method.into(),
        path: format!("{PREFIX}{name}"),
    };
    let response = answer(&request, view);
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
