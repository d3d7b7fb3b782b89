//! The GPU a µGraph is searched, priced and generated for: the one place that holds GPU
//! facts (SM count, shared memory, registers, L2, clusters) and the budgets tuned on a GPU.
//! Everything else takes a [`Target`] as a parameter. Presets per architecture
//! ([`Target::sm80`], [`Target::sm90`], [`Target::for_arch`]) serve CPU-only use; where a
//! device is present, [`Target::from_attributes`] fills the hardware facts from the driver's
//! device attributes (the code generator's driver passes the lookup). See docs/target.md.

use serde::{Deserialize, Serialize};

const KIB: usize = 1024;

/// Device attributes [`Target::from_attributes`] asks for (the driver's
/// `CU_DEVICE_ATTRIBUTE_*` of the same meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceAttr {
    /// `MULTIPROCESSOR_COUNT`.
    SmCount,
    /// `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, bytes.
    SmemPerBlockOptin,
    /// `MAX_SHARED_MEMORY_PER_BLOCK` (without opting in), bytes.
    SmemPerBlock,
    /// `MAX_SHARED_MEMORY_PER_MULTIPROCESSOR`, bytes.
    SmemPerSm,
    /// `RESERVED_SHARED_MEMORY_PER_BLOCK`, bytes.
    SmemReservedPerBlock,
    /// `MAX_REGISTERS_PER_MULTIPROCESSOR`, 32-bit registers.
    RegsPerSm,
    /// `MAX_THREADS_PER_BLOCK`.
    MaxThreadsPerBlock,
    /// `L2_CACHE_SIZE`, bytes.
    L2Bytes,
}

/// Budgets measured or tuned on a GPU of the architecture, which decide schedules: kept
/// apart from the hardware facts because they are chosen, not read from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    /// Grids of at most this many blocks are treated as one wave (one block an SM): they take
    /// the deeper pipelining budget, attention's two row groups a warp, and bound the blocks a
    /// thread-block cluster split may make. The H100's and H200's 132 SMs.
    pub one_wave_blocks: usize,
    /// Most blocks a cluster split into clusters of more than two may make: an H200 (132
    /// SMs) fits 30 clusters of 4 or 15 of 8 (`cudaOccupancyMaxActiveClusters` at 136 KiB a
    /// block) but 66 of 2; on the H100, grids of 128 blocks in clusters of 4 or 8 ran 1.5-2x
    /// slower than in clusters of 2, as two waves would.
    pub wide_cluster_blocks: usize,
    /// Shared memory per block up to which a grid of more than one wave multi-buffers its
    /// loop's input tiles (two blocks fit an H100 SM, one an A100 SM); fewer stages above it.
    pub pipeline_smem: usize,
    /// The pipelining budget of a one-wave grid: deeper pipelines keep more loads in flight
    /// (within the 163 KiB an A100 block may opt into).
    pub one_wave_pipeline_smem: usize,
    /// Registers a thread of the warp-specialised attention's producer warpgroup keeps
    /// (`setmaxnreg`; it only copies).
    pub ws_producer_regs: usize,
    /// Registers each of the two consumer warpgroups' 256 threads takes: 24 * 128 + 240 * 256
    /// of the SM's 65536 (at 232, ptxas spilled S: MQA b=16's prototype took 39.6 us, 38.3 at
    /// 240 on the H100).
    pub ws_consumer_regs: usize,
    /// Registers a thread of the three-consumer form takes: 3 * 128 * 160 + 128 * 24 of 65536
    /// (ptxas spills nothing at 152 or 160 in the 64-key steps; GQA b=8's prototype spilled 52
    /// bytes at 144).
    pub ws3_consumer_regs: usize,
    /// Most fragment registers (O, S over one softmax chunk, Q) a warp of the mma.sync
    /// attention form may hold: two blocks of at most 128 registers a thread share an SM, and
    /// two row groups of about 200 lost up to 40% on QK-norm attention's many-block candidates.
    pub flash_fragment_regs: usize,
}

/// A GPU's facts and tuned budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Architecture as `major * 10 + minor` (90 for sm_90).
    pub arch: u32,
    /// Streaming multiprocessors.
    pub num_sms: usize,
    /// Shared memory one block may opt into, bytes.
    pub smem_per_block_optin: usize,
    /// Shared memory one block gets without opting in, bytes (a kernel over it raises its
    /// dynamic limit).
    pub smem_per_block: usize,
    /// Shared memory of one SM, bytes.
    pub smem_per_sm: usize,
    /// Shared memory the system reserves on an SM for each resident block, bytes.
    pub smem_reserved_per_block: usize,
    /// 32-bit registers of one SM.
    pub regs_per_sm: usize,
    /// Most 32-bit registers one thread may use.
    pub regs_per_thread: usize,
    /// Most threads of one block.
    pub max_threads_per_block: usize,
    /// L2 cache, bytes.
    pub l2_bytes: usize,
    /// Largest portable thread-block cluster (1: no clusters).
    pub max_cluster_portable: usize,
    /// Largest cluster a kernel may opt into (non-portable size).
    pub max_cluster_nonportable: usize,
    /// Budgets measured or tuned on a GPU of this architecture.
    pub budgets: Budgets,
}

impl Target {
    /// A100 SXM (sm_80): 108 SMs, 163 KiB of shared memory a block may opt into, 164 KiB an
    /// SM, 40 MiB of L2, no clusters. Its budgets are the H100's (the ones its kernels have
    /// been generated with; none was measured on an A100).
    pub const fn sm80() -> Target {
        Target {
            arch: 80,
            num_sms: 108,
            smem_per_block_optin: 163 * KIB,
            smem_per_block: 48 * KIB,
            smem_per_sm: 164 * KIB,
            smem_reserved_per_block: KIB,
            regs_per_sm: 65536,
            regs_per_thread: 255,
            max_threads_per_block: 1024,
            l2_bytes: 40 * KIB * KIB,
            max_cluster_portable: 1,
            max_cluster_nonportable: 1,
            budgets: Self::SM90_BUDGETS,
        }
    }

    /// H100 SXM (sm_90): 132 SMs, 227 KiB (232448 bytes) of shared memory a block may opt
    /// into, 228 KiB an SM, 50 MiB of L2, clusters of 8 (16 non-portable).
    pub const fn sm90() -> Target {
        Target {
            arch: 90,
            num_sms: 132,
            smem_per_block_optin: 227 * KIB,
            smem_per_block: 48 * KIB,
            smem_per_sm: 228 * KIB,
            smem_reserved_per_block: KIB,
            regs_per_sm: 65536,
            regs_per_thread: 255,
            max_threads_per_block: 1024,
            l2_bytes: 50 * KIB * KIB,
            max_cluster_portable: 8,
            max_cluster_nonportable: 16,
            budgets: Self::SM90_BUDGETS,
        }
    }

    /// The budgets measured on the H100 and H200.
    const SM90_BUDGETS: Budgets = Budgets {
        one_wave_blocks: 132,
        wide_cluster_blocks: 120,
        pipeline_smem: 100 * KIB,
        one_wave_pipeline_smem: 160 * KIB,
        ws_producer_regs: 24,
        ws_consumer_regs: 240,
        ws3_consumer_regs: 160,
        flash_fragment_regs: 160,
    };

    /// Shared memory a block may opt into on `arch`, as NVIDIA publishes it (the CUDA
    /// programming guide's table of compute capabilities): sm_70 96 KiB, sm_75 64 KiB, sm_80
    /// and sm_87 163 KiB, sm_86 and sm_89 99 KiB, sm_90 and sm_100 227 KiB; `None` for an
    /// architecture not in that list. The reference-compatible `compile()` checks a program
    /// against it without a device.
    pub const fn published_smem_optin(arch: u32) -> Option<usize> {
        match arch {
            70 => Some(96 * KIB),
            75 => Some(64 * KIB),
            80 | 87 => Some(Self::sm80().smem_per_block_optin),
            86 | 89 => Some(99 * KIB),
            90 | 100 => Some(Self::sm90().smem_per_block_optin),
            _ => None,
        }
    }

    /// The preset of `arch`'s family with `arch` itself: [`Target::sm90`] for sm_90 and
    /// later, [`Target::sm80`] below.
    pub const fn for_arch(arch: u32) -> Target {
        let base = if arch >= 90 { Self::sm90() } else { Self::sm80() };
        Target { arch, ..base }
    }

    /// The target of a device of architecture `arch` whose attributes `attr` returns (`None`
    /// where the driver does not know one): hardware facts from the device, the rest (register
    /// limit per thread, cluster sizes, budgets) from [`Target::for_arch`]. An attribute the
    /// device does not report, or reports as zero, keeps the preset's value.
    pub fn from_attributes(arch: u32, attr: impl Fn(DeviceAttr) -> Option<usize>) -> Target {
        let base = Self::for_arch(arch);
        let get = |a: DeviceAttr, preset: usize| attr(a).filter(|&v| v > 0).unwrap_or(preset);
        Target {
            num_sms: get(DeviceAttr::SmCount, base.num_sms),
            smem_per_block_optin: get(DeviceAttr::SmemPerBlockOptin, base.smem_per_block_optin),
            smem_per_block: get(DeviceAttr::SmemPerBlock, base.smem_per_block),
            smem_per_sm: get(DeviceAttr::SmemPerSm, base.smem_per_sm),
            smem_reserved_per_block: get(DeviceAttr::SmemReservedPerBlock, base.smem_reserved_per_block),
            regs_per_sm: get(DeviceAttr::RegsPerSm, base.regs_per_sm),
            max_threads_per_block: get(DeviceAttr::MaxThreadsPerBlock, base.max_threads_per_block),
            l2_bytes: get(DeviceAttr::L2Bytes, base.l2_bytes),
            ..base
        }
    }

    /// Shared memory of a block that leaves room for a second one on an SM (half an SM's,
    /// less each block's reservation): 113 KiB on the H100. The search's co-resident twins
    /// cap their stages at it (`BlockGraph::smem_cap`).
    pub const fn co_resident_smem(&self) -> usize {
        (self.smem_per_sm.saturating_sub(2 * self.smem_reserved_per_block)) / 2
    }

    /// Shared memory up to which a kernel of `blocks` thread blocks multi-buffers its loop's
    /// input tiles: [`Budgets::one_wave_pipeline_smem`] for at most
    /// [`Budgets::one_wave_blocks`] blocks, else [`Budgets::pipeline_smem`].
    pub const fn pipeline_budget(&self, blocks: usize) -> usize {
        if blocks <= self.budgets.one_wave_blocks {
            self.budgets.one_wave_pipeline_smem
        } else {
            self.budgets.pipeline_smem
        }
    }
}

impl Default for Target {
    /// [`Target::sm90`].
    fn default() -> Self {
        Target::sm90()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_hold_the_published_figures() {
        let h = Target::sm90();
        assert_eq!((h.arch, h.num_sms), (90, 132));
        assert_eq!((h.smem_per_block_optin, h.smem_per_sm), (232448, 233472));
        assert_eq!(h.l2_bytes, 52428800);
        assert_eq!((h.max_cluster_portable, h.max_cluster_nonportable), (8, 16));
        assert_eq!(h.co_resident_smem(), 113 * 1024);
        let b = h.budgets;
        assert_eq!((b.one_wave_blocks, b.wide_cluster_blocks), (132, 120));
        assert_eq!((b.pipeline_smem, b.one_wave_pipeline_smem), (102400, 163840));
        assert_eq!((b.ws_producer_regs, b.ws_consumer_regs, b.ws3_consumer_regs), (24, 240, 160));
        // The warp-specialised register split fits the SM's register file.
        assert!(b.ws_producer_regs * 128 + b.ws_consumer_regs * 256 <= h.regs_per_sm);
        assert!(b.ws_producer_regs * 128 + b.ws3_consumer_regs * 384 <= h.regs_per_sm);
        let a = Target::sm80();
        assert_eq!((a.arch, a.num_sms), (80, 108));
        assert_eq!((a.smem_per_block_optin, a.smem_per_sm), (166912, 167936));
        assert_eq!((a.l2_bytes, a.max_cluster_portable), (41943040, 1));
        assert_eq!(a.budgets, b);
        assert!(b.one_wave_pipeline_smem <= a.smem_per_block_optin);
    }

    #[test]
    fn for_arch_keeps_the_arch_and_takes_its_family() {
        assert_eq!(Target::for_arch(90), Target::sm90());
        assert_eq!(Target::for_arch(80), Target::sm80());
        let t = Target::for_arch(86);
        assert_eq!((t.arch, t.num_sms), (86, 108));
        let t = Target::for_arch(100);
        assert_eq!((t.arch, t.smem_per_block_optin), (100, 227 * 1024));
    }

    #[test]
    fn pipeline_budget_turns_at_one_wave() {
        let t = Target::sm90();
        assert_eq!(t.pipeline_budget(132), 160 * 1024);
        assert_eq!(Target::published_smem_optin(90), Some(Target::sm90().smem_per_block_optin));
        assert_eq!(Target::published_smem_optin(80), Some(Target::sm80().smem_per_block_optin));
        assert_eq!((Target::published_smem_optin(89), Target::published_smem_optin(61)), (Some(99 * 1024), None));
        assert_eq!(t.pipeline_budget(133), 100 * 1024);
    }

    #[test]
    fn device_attributes_fill_the_hardware_facts() {
        // An H100 PCIe: 114 SMs, the sm_90 shared memory, 50 MiB of L2.
        let pcie = |a: DeviceAttr| {
            Some(match a {
                DeviceAttr::SmCount => 114,
                DeviceAttr::SmemPerBlockOptin => 232448,
                DeviceAttr::SmemPerBlock => 49152,
                DeviceAttr::SmemPerSm => 233472,
                DeviceAttr::SmemReservedPerBlock => 1024,
                DeviceAttr::RegsPerSm => 65536,
                DeviceAttr::MaxThreadsPerBlock => 1024,
                DeviceAttr::L2Bytes => 52428800,
            })
        };
        let t = Target::from_attributes(90, pcie);
        assert_eq!(t, Target { num_sms: 114, ..Target::sm90() });
        // Another device's figures land in their fields; budgets stay the preset's.
        let odd = |a: DeviceAttr| match a {
            DeviceAttr::SmCount => Some(7),
            DeviceAttr::SmemPerBlockOptin => Some(100_000),
            DeviceAttr::SmemPerSm => Some(200_000),
            DeviceAttr::SmemReservedPerBlock => Some(0),
            DeviceAttr::L2Bytes => Some(123),
            _ => None,
        };
        let t = Target::from_attributes(80, odd);
        assert_eq!((t.num_sms, t.smem_per_block_optin, t.smem_per_sm, t.l2_bytes), (7, 100_000, 200_000, 123));
        // Unknown or zero attributes keep the preset's.
        assert_eq!(t.smem_reserved_per_block, 1024);
        assert_eq!((t.smem_per_block, t.regs_per_sm), (48 * 1024, 65536));
        assert_eq!(t.budgets, Target::sm80().budgets);
        assert_eq!(Target::from_attributes(90, |_| None), Target::sm90());
    }
}
