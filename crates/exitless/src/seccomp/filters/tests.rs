use std::collections::BTreeSet;

use super::*;

/// Distinct system calls, and ioctl requests, of `list`.
fn counts(list: &[Allowed]) -> (usize, usize) {
    let calls: BTreeSet<_> = list.iter().map(|a| a.nr).collect();
    let ioctls: BTreeSet<u64> = list
        .iter()
        .filter(|a| a.nr == libc::SYS_ioctl)
        .flat_map(|a| match &a.args {
            Args::OneOf { values, .. } => values.clone(),
            _ => Vec::new(),
        })
        .collect();
    (calls.len(), ioctls.len())
}

#[test]
fn the_documented_table_counts_what_each_kind_may_call() {
    let doc = include_str!("../../../../../docs/hardening.md");
    let kinds = ThreadKind::ALL.map(|k| (k.name(), counts(&allowed(k))));
    let runtime = ("every thread (runtime)", counts(&runtime()));
    for (name, (calls, ioctls)) in kinds.into_iter().chain([runtime]) {
        let row = format!("| {name} | {calls} | {ioctls} |");
        assert!(
            doc.contains(&row),
            "docs/hardening.md's seccomp table lacks the row {row}"
        );
    }
}

#[test]
fn main_allows_every_call_of_the_threads_it_starts() {
    let main = allowed(ThreadKind::Main);
    for kind in ThreadKind::ALL {
        for a in allowed(kind) {
            assert!(
                main.iter().any(|m| m.nr == a.nr),
                "system call {} of the {} thread",
                a.nr,
                kind.name()
            );
        }
    }
}
