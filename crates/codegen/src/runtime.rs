//! The CUDA runtime header's parts (`crates/codegen/runtime/*.cuh`), what each needs, and the
//! header a generated source inlines: the common part and the parts its kernels use.
//!
//! The emitters say which parts they use ([`Parts`] on each emitted kernel); [`Parts::header`]
//! adds the parts those need and joins them in header order.

/// One part of the runtime header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// `mirage_runtime.cuh`: types, conversions, copies, element-wise ops, L2 policies,
    /// barriers, mbarriers and clusters. Every source inlines it.
    Common,
    /// `reductions.cuh`: block and warp reductions, row sums and norms, vector loads and stores.
    Reductions,
    /// `matmul.cuh`: the tile matmul and the loop accumulators (`MmaAcc`, `RowSumAcc`).
    Matmul,
    /// `attention.cuh`: the register-resident online-softmax attention (`Flash`).
    Attention,
    /// `wgmma.cuh`: warpgroup tensor cores and the loop accumulator on them (`MmaAccWG`).
    Wgmma,
    /// `warp_specialized.cuh`: the wgmma attention (`FlashWG`) and its producer warpgroup.
    WarpSpecialized,
}

impl Part {
    /// Every part, in the order the header joins them (each after the parts it needs).
    pub const ALL: [Part; 6] =
        [Part::Common, Part::Reductions, Part::Matmul, Part::Attention, Part::Wgmma, Part::WarpSpecialized];

    /// The part's file under `crates/codegen/runtime/`.
    pub fn file(self) -> &'static str {
        match self {
            Part::Common => "mirage_runtime.cuh",
            Part::Reductions => "reductions.cuh",
            Part::Matmul => "matmul.cuh",
            Part::Attention => "attention.cuh",
            Part::Wgmma => "wgmma.cuh",
            Part::WarpSpecialized => "warp_specialized.cuh",
        }
    }

    /// The part's text.
    pub fn text(self) -> &'static str {
        match self {
            Part::Common => include_str!("../runtime/mirage_runtime.cuh"),
            Part::Reductions => include_str!("../runtime/reductions.cuh"),
            Part::Matmul => include_str!("../runtime/matmul.cuh"),
            Part::Attention => include_str!("../runtime/attention.cuh"),
            Part::Wgmma => include_str!("../runtime/wgmma.cuh"),
            Part::WarpSpecialized => include_str!("../runtime/warp_specialized.cuh"),
        }
    }

    /// The other parts whose functions this part's code calls (the common part aside, which
    /// every part needs).
    pub fn needs(self) -> &'static [Part] {
        match self {
            Part::Common | Part::Reductions | Part::Matmul | Part::Wgmma => &[],
            Part::Attention => &[Part::Matmul],
            Part::WarpSpecialized => &[Part::Reductions, Part::Attention, Part::Wgmma],
        }
    }

    const fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The named barriers (`bar.sync` ids) of a generated block, each with one purpose: the
/// common part's `mi::NamedBarrier` has the same ids (a test compares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedBarrier {
    /// `__syncthreads`: every thread of the block.
    Block = 0,
    /// The consumer threads of a warp-specialised block after its producer has left
    /// (`mi::bar_sync_n`, which `Ctx::sync` emits there).
    Consumers = 1,
    /// The first warpgroup's turn of the ping-pong wgmma issue; warpgroup `w` takes
    /// `Turns + w`.
    Turns = 8,
}

impl NamedBarrier {
    /// Every named barrier.
    pub const ALL: [NamedBarrier; 3] = [NamedBarrier::Block, NamedBarrier::Consumers, NamedBarrier::Turns];

    /// The barrier's `bar.sync` id.
    pub fn id(self) -> u32 {
        self as u32
    }
}

/// A set of runtime parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Parts(u8);

impl Parts {
    /// No part (the common part is added by [`Self::closure`]).
    pub const NONE: Parts = Parts(0);

    /// The set of `parts`.
    pub fn of(parts: &[Part]) -> Parts {
        parts.iter().fold(Parts::NONE, |s, &p| s.with(p))
    }

    /// This set and `p`.
    #[must_use]
    pub const fn with(self, p: Part) -> Parts {
        Parts(self.0 | p.bit())
    }

    /// This set and `other`.
    #[must_use]
    pub fn union(self, other: Parts) -> Parts {
        Parts(self.0 | other.0)
    }

    /// Whether `p` is in the set.
    pub fn contains(self, p: Part) -> bool {
        self.0 & p.bit() != 0
    }

    /// The set with the common part and every part a member needs, transitively.
    #[must_use]
    pub fn closure(self) -> Parts {
        let mut s = self.with(Part::Common);
        // `Part::ALL` lists each part after the parts it needs: one pass from the end suffices.
        for p in Part::ALL.iter().rev() {
            if s.contains(*p) {
                s = p.needs().iter().fold(s, |s, &q| s.with(q));
            }
        }
        s
    }

    /// The members in header order.
    pub fn iter(self) -> impl Iterator<Item = Part> {
        Part::ALL.into_iter().filter(move |&p| self.contains(p))
    }

    /// The header text of [`Self::closure`]: its parts joined in header order.
    pub fn header(self) -> String {
        self.closure().iter().map(Part::text).collect()
    }
}

/// The whole runtime header: every part, in order.
pub const RUNTIME_HEADER: &str = concat!(
    include_str!("../runtime/mirage_runtime.cuh"),
    include_str!("../runtime/reductions.cuh"),
    include_str!("../runtime/matmul.cuh"),
    include_str!("../runtime/attention.cuh"),
    include_str!("../runtime/wgmma.cuh"),
    include_str!("../runtime/warp_specialized.cuh"),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_comes_after_the_parts_it_needs() {
        for (i, p) in Part::ALL.iter().enumerate() {
            for q in p.needs() {
                let j = Part::ALL.iter().position(|x| x == q).expect("listed");
                assert!(j < i, "{p:?} needs {q:?}, which the header joins after it");
            }
        }
    }

    #[test]
    fn closure_adds_the_common_part_and_what_members_need() {
        assert_eq!(Parts::NONE.closure(), Parts::of(&[Part::Common]));
        assert_eq!(
            Parts::of(&[Part::WarpSpecialized]).closure(),
            Parts::of(&[
                Part::Common,
                Part::Reductions,
                Part::Matmul,
                Part::Attention,
                Part::Wgmma,
                Part::WarpSpecialized
            ])
        );
        assert_eq!(Parts::of(&[Part::Attention]).closure(), Parts::of(&[Part::Common, Part::Matmul, Part::Attention]));
        let all: String = Part::ALL.iter().map(|p| p.text()).collect();
        assert_eq!(all, RUNTIME_HEADER);
        assert_eq!(Parts::of(&Part::ALL).header(), RUNTIME_HEADER);
    }

    /// Names a part defines at the top level of namespace `mi`: structs and functions (the
    /// identifier before the first `(` of a line that starts a definition), typedefs and macros.
    fn defined_names(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in text.lines() {
            let l = match line.strip_prefix("template <") {
                Some(rest) => rest.split_once("> ").map_or("", |(_, r)| r),
                None => line,
            };
            if let Some(r) = l.strip_prefix("typedef ") {
                out.extend(r.trim_end_matches(';').split_whitespace().last().map(str::to_string));
            } else if let Some((name, _)) = l.strip_prefix("using ").and_then(|r| r.split_once(" = ")) {
                out.push(name.to_string());
            } else if let Some(r) = l.strip_prefix("struct ").or_else(|| l.strip_prefix("#define ")) {
                out.push(r.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
            } else if l.starts_with("__device__") {
                if let Some(head) = l.split('(').next() {
                    let head = head.split('<').next().unwrap_or(head);
                    if let Some(name) = head.split_whitespace().last() {
                        out.push(name.to_string());
                    }
                }
            }
        }
        out
    }

    /// The part that defines each `mi::` name a source's kernels use, for [`uses_of`].
    pub(crate) fn owner(name: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| defined_names(p.text()).iter().any(|n| n == name))
    }

    /// The parts whose names (`mi::name`) `kernels` uses: a check of the emitters' [`Parts`].
    pub(crate) fn uses_of(kernels: &str) -> Result<Parts, String> {
        let mut s = Parts::NONE;
        for (i, _) in kernels.match_indices("mi::") {
            let name: String = kernels[i + 4..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            s = s.with(owner(&name).ok_or_else(|| format!("mi::{name} is defined by no runtime part"))?);
        }
        Ok(s)
    }

    /// The zoo's programs (paper workloads at b=1 and 16, and the online attentions) and the
    /// saved winners of `benches/gpu/results/h200-2026-11-29-s50/all-graphs`.
    fn graphs() -> Vec<(String, mirage_ugraph::KernelGraph)> {
        use mirage_ugraph::zoo;
        let mut out = Vec::new();
        for b in [1, 16] {
            for p in zoo::paper_workloads(b).expect("zoo") {
                out.push((format!("{} b={b}", p.name), p.ugraph));
                out.push((format!("{} b={b} reference", p.name), p.reference));
            }
        }
        let a = zoo::Attn { b: 8, h: 64, d: 64, s: 4096, splits: 1, frange: 16, qsplit: 1 };
        let dt = mirage_ugraph::DType::Float16;
        for (name, p) in [
            ("online", zoo::attention_online(a, dt)),
            ("qnorm online", zoo::qnorm_attention_online(a, dt)),
            ("qknorm online", zoo::qknorm_attention_online(a, dt)),
        ] {
            out.push((name.to_string(), p.expect("zoo").ugraph));
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../benches/gpu/results/h200-2026-11-29-s50/all-graphs");
        for e in std::fs::read_dir(dir).expect("the saved winners") {
            let path = e.expect("an entry").path();
            let text = std::fs::read_to_string(&path).expect("readable");
            out.push((path.display().to_string(), mirage_ugraph::from_json(&text).expect("a graph")));
        }
        out
    }

    /// Every source inlines the parts whose names its kernels use: the emitters' [`Parts`]
    /// miss none (each named by its emitter, so a kernel that calls a part it does not name
    /// fails here before it fails to compile).
    #[test]
    fn sources_inline_every_part_their_kernels_use() {
        use crate::{generate, Options, WsWarpgroups};
        for (name, g) in graphs() {
            for arch in [80, 90] {
                for wgs in [WsWarpgroups::Auto, WsWarpgroups::Two, WsWarpgroups::Three] {
                    let opts = Options { ws_warpgroups: wgs, ..Options::for_arch(arch) };
                    let p = generate(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
                    let used = uses_of(p.kernels_source()).unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert_eq!(used.union(p.runtime_parts), p.runtime_parts, "{name} sm_{arch} {wgs:?}");
                    assert_eq!(p.runtime_parts, p.runtime_parts.closure(), "{name}");
                    assert_eq!(p.source.matches("namespace mi {").count(), p.runtime_parts.iter().count());
                }
            }
        }
    }

    /// The header's `enum class NamedBarrier` has [`NamedBarrier`]'s names and ids.
    #[test]
    fn named_barriers_match_the_header() {
        let text = Part::Common.text();
        let start = text.find("enum class NamedBarrier").expect("the header's enum");
        let body = &text[start..start + text[start..].find("};").expect("its end")];
        let mut ids: Vec<(String, u32)> = Vec::new();
        for line in body.lines().map(str::trim).filter(|l| !l.starts_with("//") && l.contains(" = ")) {
            let (name, id) = line.trim_end_matches(',').split_once(" = ").expect("name = id");
            ids.push((name.to_string(), id.parse().expect("a number")));
        }
        let rust: Vec<(String, u32)> = NamedBarrier::ALL.iter().map(|b| (format!("{b:?}"), b.id())).collect();
        assert_eq!(ids, rust);
    }

    #[test]
    fn names_are_found_in_their_parts() {
        assert_eq!(owner("lin_tid"), Some(Part::Common));
        assert_eq!(owner("cluster_push_async"), Some(Part::Common));
        assert_eq!(owner("block_sum"), Some(Part::Reductions));
        assert_eq!(owner("MmaAcc"), Some(Part::Matmul));
        assert_eq!(owner("Flash"), Some(Part::Attention));
        assert_eq!(owner("MmaAccWG"), Some(Part::Wgmma));
        assert_eq!(owner("FlashWG"), Some(Part::WarpSpecialized));
        assert_eq!(owner("no_such_function"), None);
    }
}
