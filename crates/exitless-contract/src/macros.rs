//! The declaration macros: each constant and block is written once, and listed for the C
//! header ([`crate::header`]).

/// Declares constants shared with the guest and lists them under `$list` for the C header.
macro_rules! contract_consts {
    ($list:ident; $($(#[doc = $doc:literal])* $name:ident: $ty:ty = $value:expr;)*) => {
        $($(#[doc = $doc])* pub const $name: $ty = $value;)*
        /// Every constant above, by name, for generating the guest's C header.
        pub const $list: &[(&str, u64)] = &[$((stringify!($name), $name as u64)),*];
    };
}

/// Declares `#[repr(C)]` blocks of `u64` fields (`name` or `name[N]`) and their C text.
macro_rules! contract_structs {
    ($($(#[doc = $doc:literal])* struct $name:ident as $cname:ident {
        $($(#[doc = $fdoc:literal])* $field:ident $([$len:literal])?,)*
    })*) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(
                Clone, Copy, Debug, Default, PartialEq, Eq,
                zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable,
            )]
            pub struct $name {
                $($(#[doc = $fdoc])* pub $field: contract_field_type!($($len)?),)*
            }
        )*
        /// C declarations of every block above, for generating `contract.h`.
        pub const CONTRACT_STRUCTS_C: &str = concat!($(
            "struct ", stringify!($cname), " {\n",
            $("    uint64_t ", stringify!($field), $("[", stringify!($len), "]",)? ";\n",)*
            "};\n",
        )*);
    };
}

macro_rules! contract_field_type {
    () => {
        u64
    };
    ($len:literal) => {
        [u64; $len]
    };
}
