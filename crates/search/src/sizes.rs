//! Grid sizes and loop ranges derived from a program's own index sizes.
//!
//! The configured sizes (`grid_sizes`: powers of two, 96, 192; `franges`: 1, 4, 16, 32, 64)
//! cut a reduction index of 4096 or 8192 keys into whole 64- or 128-wide tiles, the tiles the
//! code generator's tensor-core and warp-specialised forms take. An index whose size has an
//! odd factor they lack (32,000 keys = 2^8 * 125) gets only ragged tiles from them (125 or
//! 250 keys: every row of a K tile misaligned for 16-byte copies). For such an index the
//! search adds the grid sizes near [`GRID_TARGETS`] that split it into blocks of whole tiles
//! ([`derived_grid_sizes`]), and for every grid the loop ranges that walk a block's share in
//! whole tiles ([`derived_ranges`]). An index the configured sizes already cut into whole
//! tiles, or one no whole tile divides, gets nothing: such programs search exactly as before.

/// Tile extents along a reduction index that the derived sizes aim for.
pub const WHOLE_TILES: [usize; 2] = [64, 128];

/// Block counts along a split reduction index near which derived grid sizes are picked (the
/// split-KV decode forms of 4096-32768 keys use 8-32 splits a head).
pub const GRID_TARGETS: [usize; 3] = [8, 16, 32];

/// Largest derived loop range.
pub const MAX_DERIVED_RANGE: usize = 512;

/// Largest tile along a reduction index that counts as a cut the configured sizes give.
const MAX_ALIGNED_TILE: usize = 256;

/// Whether index size `s` needs derived sizes: some whole tile divides it, and no configured
/// grid size and loop range cut it into aligned tiles (a multiple of 16 elements, at most
/// [`MAX_ALIGNED_TILE`]: whole mma k-steps, rows of whole 16-byte chunks).
pub fn needs_derived(s: usize, grid_sizes: &[usize], franges: &[usize]) -> bool {
    if !WHOLE_TILES.iter().any(|&t| s.is_multiple_of(t) && s > t) {
        return false;
    }
    let grids = std::iter::once(1).chain(grid_sizes.iter().copied().filter(|&g| g > 1));
    let aligned = |g: usize, f: usize| {
        g.checked_mul(f).is_some_and(|gf| {
            s.is_multiple_of(gf) && {
                let tile = s / gf;
                tile.is_multiple_of(16) && tile <= MAX_ALIGNED_TILE
            }
        })
    };
    !grids.flat_map(|g| franges.iter().map(move |&f| (g, f))).any(|(g, f)| aligned(g, f))
}

/// Divisors of `n`, ascending.
fn divisors(n: usize) -> Vec<usize> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1usize;
    while d.checked_mul(d).is_some_and(|dd| dd <= n) {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Grid sizes for a reduction index of size `s` that [`needs_derived`]: for each target of
/// [`GRID_TARGETS`] and each whole tile `t` dividing `s`, the divisor of `s / t` nearest to
/// the target by ratio (the larger on a tie), so that each block's share is whole tiles.
/// Sizes the configuration already has are left out.
pub fn derived_grid_sizes(s: usize, grid_sizes: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    for t in WHOLE_TILES {
        if !s.is_multiple_of(t) {
            continue;
        }
        let ds = divisors(s / t);
        for target in GRID_TARGETS {
            let ratio = |d: usize| (d as f64 / target as f64).ln().abs();
            let best =
                ds.iter().copied().filter(|&d| d > 1).min_by(|&a, &b| ratio(a).total_cmp(&ratio(b)).then(b.cmp(&a)));
            if let Some(g) = best {
                if !grid_sizes.contains(&g) && !out.contains(&g) {
                    out.push(g);
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// Loop ranges that walk `extent` (a block's share of a derived index) in whole tiles, at
/// least 2 and at most [`MAX_DERIVED_RANGE`], leaving out the configured `franges`.
pub fn derived_ranges(extent: usize, franges: &[usize]) -> Vec<usize> {
    let mut out: Vec<usize> = WHOLE_TILES
        .iter()
        .filter(|&&t| extent.is_multiple_of(t))
        .map(|&t| extent / t)
        .filter(|&f| (2..=MAX_DERIVED_RANGE).contains(&f) && !franges.contains(&f))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Every size the derived grids and loops of index sizes `sizes` may split a sum by (for the
/// e-graph's `sum-split`): the derived grid sizes, and the derived ranges of every grid
/// (configured or derived, and none) along each such index.
pub fn derived_factors(sizes: &[usize], grid_sizes: &[usize], franges: &[usize]) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for &s in sizes {
        if !needs_derived(s, grid_sizes, franges) {
            continue;
        }
        let extra = derived_grid_sizes(s, grid_sizes);
        out.extend(extra.iter().map(|&g| g as u64));
        let grids = std::iter::once(1).chain(grid_sizes.iter().copied()).chain(extra);
        for g in grids.filter(|&g| g >= 1 && s.is_multiple_of(g)) {
            out.extend(derived_ranges(s / g, franges).into_iter().map(|f| f as u64));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRIDS: [usize; 10] = [2, 4, 8, 16, 32, 64, 96, 128, 192, 256];
    const FRANGES: [usize; 5] = [1, 4, 16, 32, 64];

    #[test]
    fn power_of_two_indices_and_untileable_ones_derive_nothing() {
        // 14,336 and 27,648 (odd factors 7 and 27) already get aligned tiles of 224 and 144.
        for s in [4096, 8192, 32768, 1024, 128, 14336, 27648] {
            assert!(!needs_derived(s, &GRIDS, &FRANGES), "{s}");
        }
        // No whole tile divides these: nothing to aim for.
        for s in [4097, 1000, 96, 64] {
            assert!(!needs_derived(s, &GRIDS, &FRANGES), "{s}");
        }
        assert!(derived_factors(&[4096, 4097, 1000, 8192, 14336], &GRIDS, &FRANGES).is_empty());
    }

    #[test]
    fn an_odd_factor_gets_grids_of_whole_tiles_and_loops_over_them() {
        // 32,000 keys: no configured (grid, range) pair gives 64- or 128-key tiles.
        assert!(needs_derived(32000, &GRIDS, &FRANGES));
        let g = derived_grid_sizes(32000, &GRIDS);
        assert_eq!(g, vec![10, 20, 25]);
        for &x in &g {
            let share = 32000 / x;
            let ranges = derived_ranges(share, &FRANGES);
            assert!(!ranges.is_empty(), "{x}");
            for f in ranges {
                assert!(WHOLE_TILES.contains(&(share / f)) && share.is_multiple_of(f));
            }
        }
        // 20 blocks of 1600 keys: 25 tiles of 64.
        assert_eq!(derived_ranges(1600, &FRANGES), vec![25]);
        let factors = derived_factors(&[32000], &GRIDS, &FRANGES);
        for f in [10, 20, 25, 50, 125, 250, 500] {
            assert!(factors.contains(&f), "{f} in {factors:?}");
        }
    }

    #[test]
    fn configured_sizes_are_not_repeated() {
        assert!(derived_ranges(64 * 32, &FRANGES).is_empty());
        assert_eq!(derived_ranges(64 * 5, &FRANGES), vec![5]);
        assert_eq!(divisors(500), vec![1, 2, 4, 5, 10, 20, 25, 50, 100, 125, 250, 500]);
        assert_eq!(divisors(1), vec![1]);
    }
}
