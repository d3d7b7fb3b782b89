//! Assigning candidate outputs to reference outputs.
//!
//! Outputs need not come in the same order: any candidate output may stand for any reference
//! output of the same dims. Every (reference, candidate) pair of equal dims starts compatible;
//! a compared element that differs rules the pair out. The graphs are equivalent under some
//! assignment iff the compatibility relation still has a perfect matching, found here by
//! augmenting paths. (The reference Mirage shadowed its permutation variable and only ever
//! tried the identity.)

/// A perfect matching `reference output -> candidate output` of `compat[r][c]`, if one exists.
pub fn perfect_matching(compat: &[Vec<bool>]) -> Option<Vec<usize>> {
    let n = compat.len();
    let mut cand_of: Vec<Option<usize>> = vec![None; compat.first().map_or(0, Vec::len)];
    fn augment(r: usize, compat: &[Vec<bool>], seen: &mut [bool], cand_of: &mut [Option<usize>]) -> bool {
        for c in 0..cand_of.len() {
            if compat[r][c] && !seen[c] {
                seen[c] = true;
                let free = match cand_of[c] {
                    None => true,
                    Some(r2) => augment(r2, compat, seen, cand_of),
                };
                if free {
                    cand_of[c] = Some(r);
                    return true;
                }
            }
        }
        false
    }
    for r in 0..n {
        let mut seen = vec![false; cand_of.len()];
        if !augment(r, compat, &mut seen, &mut cand_of) {
            return None;
        }
    }
    let mut out = vec![0; n];
    for (c, r) in cand_of.iter().enumerate() {
        if let Some(r) = r {
            out[*r] = c;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_non_identity_assignments() {
        let compat = vec![vec![false, true], vec![true, true]];
        assert_eq!(perfect_matching(&compat), Some(vec![1, 0]));
        let compat = vec![vec![false, true], vec![false, true]];
        assert_eq!(perfect_matching(&compat), None);
        assert_eq!(perfect_matching(&[vec![true]]), Some(vec![0]));
        let compat = vec![vec![true, true, false], vec![true, false, false], vec![false, true, true]];
        assert_eq!(perfect_matching(&compat), Some(vec![1, 0, 2]));
    }
}
