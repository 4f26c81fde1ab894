use super::build::Tables;
use super::*;

const RAM: u64 = 0x10_0000;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap()
}

#[test]
fn four_levels_translate_with_permissions_anded_down_them() {
    let mem = memory();
    let mut t = Tables::new(&mem, 0x1_0000);
    let pt = t.attach(0x0018, 7);
    let ctx = context(&mem, t.root, 0x0018).unwrap();
    assert_eq!(
        ctx,
        Context {
            domain: 7,
            page_table: pt
        }
    );
    let iova = 0x7f12_3456_7000;
    t.map(pt, iova, 0x8_0000, VTD_PTE_R | VTD_PTE_W);
    let leaf = walk(&mem, &ctx, iova + 0x10, Access::Write).unwrap();
    assert_eq!(leaf.allows(iova + 0x10, Access::Write), Ok(0x8_0010));
    // Read-only at the last level: reads pass, writes are denied.
    t.map(pt, iova + 0x1000, 0x9_0000, VTD_PTE_R);
    let leaf = walk(&mem, &ctx, iova + 0x1000, Access::Read).unwrap();
    assert_eq!(leaf.allows(iova + 0x1004, Access::Read), Ok(0x9_0004));
    assert_eq!(leaf.allows(iova + 0x1004, Access::Write), Err(VTD_FR_WRITE));
    // Write-only at an upper level takes R away from everything below it.
    let pml4e = pt + 8 * ((iova >> 39) & 0x1ff);
    t.write(pml4e, t.read(pml4e) & !VTD_PTE_R);
    let leaf = walk(&mem, &ctx, iova, Access::Write).unwrap();
    assert_eq!(leaf.permissions, VTD_PTE_W);
    assert_eq!(
        walk(&mem, &ctx, iova + 0x1000, Access::Read),
        Err(VTD_FR_READ),
        "R at the leaf, W above: nothing allowed, not present"
    );
}

#[test]
fn missing_or_invalid_structures_give_their_fault_reasons() {
    let mem = memory();
    let mut t = Tables::new(&mem, 0x1_0000);
    assert_eq!(context(&mem, t.root, 0x0100), Err(VTD_FR_ROOT_NOT_PRESENT));
    let pt = t.attach(0x0100, 1);
    assert_eq!(
        context(&mem, t.root, 0x0108),
        Err(VTD_FR_CONTEXT_NOT_PRESENT)
    );
    assert_eq!(context(&mem, RAM, 0x0100), Err(VTD_FR_ROOT_TABLE));
    // A root entry pointing outside RAM.
    t.write(t.root + 16, (RAM + 0x4000) | VTD_ROOT_P);
    assert_eq!(context(&mem, t.root, 0x0100), Err(VTD_FR_CONTEXT_TABLE));
    t.attach(0x0200, 2);
    let ctx_table = t.read(t.root + 32) & TABLE_ADDR_MASK;
    // Pass-through and 3-level tables are not offered.
    t.write(ctx_table, t.read(ctx_table) | 0x8);
    assert_eq!(context(&mem, t.root, 0x0200), Err(VTD_FR_CONTEXT_INVALID));
    t.write(ctx_table, t.read(ctx_table) & !0xc);
    t.write(ctx_table + 8, 1);
    assert_eq!(context(&mem, t.root, 0x0200), Err(VTD_FR_CONTEXT_INVALID));
    let ctx = Context {
        domain: 1,
        page_table: pt,
    };
    assert_eq!(
        walk(&mem, &ctx, 1 << 48, Access::Read),
        Err(VTD_FR_ADDRESS_WIDTH)
    );
    assert_eq!(walk(&mem, &ctx, 0x5000, Access::Read), Err(VTD_FR_READ));
    assert_eq!(walk(&mem, &ctx, 0x5000, Access::Write), Err(VTD_FR_WRITE));
}

/// A table that points at itself is walked four levels and no more.
#[test]
fn a_table_pointing_at_itself_ends_after_four_levels() {
    let mem = memory();
    let mut t = Tables::new(&mem, 0x1_0000);
    let pt = t.attach(0x0008, 1);
    t.write(pt, pt | VTD_PTE_R | VTD_PTE_W);
    let ctx = Context {
        domain: 1,
        page_table: pt,
    };
    let leaf = walk(&mem, &ctx, 0, Access::Read).unwrap();
    assert_eq!(leaf.page, pt, "the table itself, as the page");
}

#[test]
fn tables_or_pages_outside_ram_and_superpages_fault() {
    let mem = memory();
    let mut t = Tables::new(&mem, 0x1_0000);
    let pt = t.attach(0x0008, 1);
    let ctx = Context {
        domain: 1,
        page_table: pt,
    };
    // A leaf outside RAM: the VMM would have to copy to or from non-RAM.
    t.map(pt, 0x2000, RAM, VTD_PTE_R | VTD_PTE_W);
    assert_eq!(walk(&mem, &ctx, 0x2000, Access::Read), Err(VTD_FR_PTE));
    // An upper level pointing outside RAM (as far out as the entry can say).
    let pml4e = pt;
    t.write(pml4e, VTD_PTE_ADDR_MASK | VTD_PTE_R | VTD_PTE_W);
    assert_eq!(walk(&mem, &ctx, 0x2000, Access::Read), Err(VTD_FR_PTE));
    // A page-table pointer outside RAM in the context entry.
    let outside = Context {
        domain: 1,
        page_table: TABLE_ADDR_MASK,
    };
    assert_eq!(walk(&mem, &outside, 0x2000, Access::Read), Err(VTD_FR_PTE));
    // A superpage bit above the last level.
    let mut t = Tables::new(&mem, 0x4_0000);
    let pt = t.attach(0x0008, 1);
    t.map(pt, 0x2000, 0x8000, VTD_PTE_R);
    t.write(pt, t.read(pt) | VTD_PTE_PS);
    let ctx = Context {
        domain: 1,
        page_table: pt,
    };
    assert_eq!(
        walk(&mem, &ctx, 0x2000, Access::Read),
        Err(VTD_FR_PTE_RESERVED)
    );
}
