//! What the fuzz targets share.

/// Reads fixed-size fields from the input, zeros once it runs out.
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    /// The next `N` bytes.
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.0.len());
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
}
