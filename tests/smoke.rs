use exitless::contract::*;
use exitless::machine::*;
#[test]
fn smoke() {
    let mut cfg = ProbeConfig::default();
    cfg.ops = vec![
        Op { kind: OP_CFG_READ, method: METHOD_PIO, address: 0x8000, size: 4, ..Default::default() },
        Op { kind: OP_CFG_READ, method: METHOD_ECAM, address: 0x8000, size: 4, ..Default::default() },
        Op { kind: OP_CFG_READ_LOOP, method: METHOD_ECAM, address: 0x8000, size: 4, count: 1000, ..Default::default() },
        Op { kind: OP_RAM_READ_LOOP, count: 1000, ..Default::default() },
        Op { kind: OP_CFG_READ_LOOP, method: METHOD_PIO, address: 0x8000, size: 4, count: 100, ..Default::default() },
    ];
    let r = run_probe(&cfg);
    match r {
        Ok(r) => { println!("{:#x?}", r.results); for i in 0..5 { println!("{:?}", r.exits(i)); } println!("{}", r.console); println!("{:?}", r.tsc_khz); }
        Err(e) => panic!("{e}"),
    }
}
