//! The one owner of the VM's KVM GSI routing table.
//!
//! `KVM_SET_GSI_ROUTING` replaces the whole table, so every route (the IOAPIC and PIC pins, and
//! each MSI/MSI-X vector) is kept here and the table is rewritten from it. Each change is
//! committed before the call that made it returns, so an irqfd signalled afterwards can never
//! use a stale route.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KvmIrqRouting, kvm_irq_routing_entry,
};
use kvm_ioctls::VmFd;

use super::IrqError;

/// IOAPIC pins (GSIs 0..24); MSI routes get GSIs from here up.
pub const IOAPIC_PINS: u32 = 24;
/// Routes KVM accepts (`KVM_MAX_IRQ_ROUTES`).
pub const MAX_ROUTES: u32 = 4096;

struct Table {
    routes: BTreeMap<u32, kvm_irq_routing_entry>,
    next_gsi: u32,
    free: Vec<u32>,
    commits: u64,
}

/// The routing table, shared by every device that routes interrupts.
pub struct GsiRouting {
    vm: Arc<VmFd>,
    table: Mutex<Table>,
}

fn irqchip_route(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        ..Default::default()
    };
    e.u.irqchip.irqchip = chip;
    e.u.irqchip.pin = pin;
    e
}

impl GsiRouting {
    /// The table KVM starts with for an in-kernel irqchip: GSI n → IOAPIC pin n, and for
    /// n < 16 also the PIC pin, committed at once.
    pub fn new(vm: Arc<VmFd>) -> Result<Self, IrqError> {
        let mut routes = BTreeMap::new();
        for gsi in 0..IOAPIC_PINS {
            routes.insert(gsi, irqchip_route(gsi, KVM_IRQCHIP_IOAPIC, gsi));
        }
        let routing = GsiRouting {
            vm,
            table: Mutex::new(Table {
                routes,
                next_gsi: IOAPIC_PINS,
                free: Vec::new(),
                commits: 0,
            }),
        };
        routing.commit(&mut routing.table.lock().unwrap())?;
        Ok(routing)
    }

    /// A GSI for an MSI route (not yet routed).
    pub fn allocate(&self) -> Result<u32, IrqError> {
        let mut t = self.table.lock().unwrap();
        if let Some(gsi) = t.free.pop() {
            return Ok(gsi);
        }
        if t.next_gsi >= MAX_ROUTES {
            return Err(IrqError::GsisExhausted(MAX_ROUTES));
        }
        t.next_gsi += 1;
        Ok(t.next_gsi - 1)
    }

    /// Give `gsi` back, removing its route.
    pub fn release(&self, gsi: u32) -> Result<(), IrqError> {
        let mut t = self.table.lock().unwrap();
        let had_route = t.routes.remove(&gsi).is_some();
        t.free.push(gsi);
        if had_route {
            self.commit(&mut t)?;
        }
        Ok(())
    }

    /// Route `gsi` to the MSI message (`address`, `data`) and commit.
    pub fn set_msi(&self, gsi: u32, address: u64, data: u32) -> Result<(), IrqError> {
        let mut e = kvm_irq_routing_entry {
            gsi,
            type_: KVM_IRQ_ROUTING_MSI,
            ..Default::default()
        };
        e.u.msi.address_lo = (address & 0xffff_ffff) as u32;
        e.u.msi.address_hi = (address >> 32) as u32;
        e.u.msi.data = data;
        let mut t = self.table.lock().unwrap();
        t.routes.insert(gsi, e);
        self.commit(&mut t)
    }

    /// Remove `gsi`'s route (its irqfd then delivers nothing) and commit.
    pub fn clear(&self, gsi: u32) -> Result<(), IrqError> {
        let mut t = self.table.lock().unwrap();
        if t.routes.remove(&gsi).is_some() {
            self.commit(&mut t)?;
        }
        Ok(())
    }

    /// `KVM_SET_GSI_ROUTING` calls made so far.
    pub fn commits(&self) -> u64 {
        self.table.lock().unwrap().commits
    }

    fn commit(&self, t: &mut Table) -> Result<(), IrqError> {
        let pic = |gsi: u32| match gsi {
            0..8 => Some(irqchip_route(gsi, KVM_IRQCHIP_PIC_MASTER, gsi)),
            8..16 => Some(irqchip_route(gsi, KVM_IRQCHIP_PIC_SLAVE, gsi - 8)),
            _ => None,
        };
        let entries: Vec<kvm_irq_routing_entry> = t
            .routes
            .values()
            .flat_map(|e| {
                let legacy = (e.type_ == KVM_IRQ_ROUTING_IRQCHIP)
                    .then(|| pic(e.gsi))
                    .flatten();
                std::iter::once(*e).chain(legacy)
            })
            .collect();
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| IrqError::GsisExhausted(MAX_ROUTES))?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(|source| IrqError::Kvm {
                what: "set the GSI routing table",
                source,
            })?;
        t.commits += 1;
        Ok(())
    }
}
