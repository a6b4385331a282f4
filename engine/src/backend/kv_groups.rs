//! KV cache groups: how a model's layers share the pages of the paged KV cache when some of
//! them attend only inside a sliding window.
//!
//! Layers of one attention kind (global, or local with one window size) form groups of equal
//! size; one page holds `block_size` tokens of K and V for the layers of one group, so a single
//! pool of equal pages serves every group. A sequence's block table lists, for each logical
//! block `i`, one page per group: entry `i * num_groups + g`. The block manager gives back a
//! local group's pages once they lie wholly before what the group's window can still see
//! (`position + 1 − window`), leaving a null entry; a long context then costs the global
//! layers' KV plus a window's worth per local group.
//!
//! A model whose layers are all of one kind has a single group of every layer (the layout
//! without groups). Gemma 3 270M (3 global, 15 local layers of window 512) has 6 groups of 3
//! layers: one global, five local.

/// Entry of a block table whose page was given back (a local group's page no layer can read).
pub const NO_PAGE: u32 = u32::MAX;

/// The first logical block a layer of `window` (`None`: global) still reads from a query at
/// position `pos` on: later queries see no earlier position, so blocks before it can go back.
pub fn first_visible_block(window: Option<usize>, pos: usize, block_size: usize) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w) / block_size)
}

/// Whether entry `index` of a block table for groups of `windows` (logical block
/// `index / groups`, group `index % groups`) is read by a step from position `pos` on: a global
/// page always, a local group's page from its window's first visible block. A prefill worker
/// ships only these to a decode worker, which gives the others back as it reserves its pages.
pub fn page_read_from(
    windows: &[Option<usize>],
    index: usize,
    pos: usize,
    block_size: usize,
) -> bool {
    let groups = windows.len().max(1);
    index / groups >= first_visible_block(windows[index % groups], pos, block_size)
}

/// The longest sequence (in tokens) a pool of `num_pages` pages of `block_size` tokens holds
/// for groups of `windows`, when steps add at most `step_tokens` tokens to it: a global group
/// keeps a page for every block; a local group, once its passed pages are given back, holds
/// the blocks of its window and of one step (before release: one more). A pool too small for
/// the local groups' share holds what fits with every page kept. Unbounded (`usize::MAX`)
/// when every group is local.
pub fn longest_sequence(
    windows: &[Option<usize>],
    num_pages: usize,
    block_size: usize,
    step_tokens: usize,
) -> usize {
    let every_page = num_pages / windows.len().max(1) * block_size;
    let global = windows.iter().filter(|w| w.is_none()).count();
    let local: usize =
        windows.iter().flatten().map(|w| (w + step_tokens).div_ceil(block_size) + 1).sum();
    match num_pages.checked_sub(local) {
        Some(_) if global == 0 => usize::MAX,
        Some(left) => every_page.max(left / global * block_size),
        None => every_page,
    }
}

/// How the layers of a model are grouped into KV pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroups {
    /// Window of each group's layers (`None`: global layers, which keep every page).
    pub windows: Vec<Option<usize>>,
    /// `(group, index in the group)` of each layer.
    pub layer_slot: Vec<(usize, usize)>,
    /// Layers a page holds (the largest group's size; a group may use fewer).
    pub layers_per_page: usize,
}

impl KvGroups {
    /// One group of every layer: each page holds all layers, nothing is released.
    pub fn single(num_layers: usize) -> Self {
        KvGroups {
            windows: vec![None],
            layer_slot: (0..num_layers).map(|l| (0, l)).collect(),
            layers_per_page: num_layers.max(1),
        }
    }

    /// How a backend groups `cfg`'s layers into KV pages: by attention kind when `hybrid` and
    /// the model has sliding-window layers, else one group of every layer.
    pub fn for_model(cfg: &crate::model_files::config::ModelConfig, hybrid: bool) -> Self {
        if hybrid {
            Self::for_layers(&(0..cfg.num_layers).map(|l| cfg.layer_window(l)).collect::<Vec<_>>())
        } else {
            Self::single(cfg.num_layers)
        }
    }

    /// Groups for layers whose windows are `layer_windows` (`None`: global). Each kind's
    /// layers are split, in layer order, into groups of the smallest kind's size; global
    /// groups come first (so group 0 is global whenever the model has a global layer).
    pub fn for_layers(layer_windows: &[Option<usize>]) -> Self {
        let mut kinds: Vec<Option<usize>> = Vec::new();
        for w in layer_windows {
            if !kinds.contains(w) {
                kinds.push(*w);
            }
        }
        if kinds.len() <= 1 {
            let mut g = Self::single(layer_windows.len());
            g.windows = vec![kinds.first().copied().flatten()];
            return g;
        }
        kinds.sort_by_key(|w| w.map_or(0, |s| s + 1));
        let count = |k: &Option<usize>| layer_windows.iter().filter(|w| *w == k).count();
        let size = kinds.iter().map(count).min().unwrap_or(1).max(1);
        let mut windows = Vec::new();
        let mut layer_slot = vec![(0, 0); layer_windows.len()];
        for kind in &kinds {
            let layers: Vec<usize> =
                (0..layer_windows.len()).filter(|&l| layer_windows[l] == *kind).collect();
            for chunk in layers.chunks(size) {
                for (j, &l) in chunk.iter().enumerate() {
                    layer_slot[l] = (windows.len(), j);
                }
                windows.push(*kind);
            }
        }
        KvGroups { windows, layer_slot, layers_per_page: size }
    }

    /// Number of groups (pages per logical block).
    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }

    /// Whether some group releases pages (a local group).
    pub fn releases(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_layers_form_one_global_and_five_local_groups_of_three() {
        // 18 layers, every 6th global (layers 5, 11, 17).
        let w: Vec<Option<usize>> =
            (0..18).map(|l| if (l + 1) % 6 == 0 { None } else { Some(512) }).collect();
        let g = KvGroups::for_layers(&w);
        assert_eq!(g.layers_per_page, 3);
        assert_eq!(g.windows, [None, Some(512), Some(512), Some(512), Some(512), Some(512)]);
        assert_eq!((g.layer_slot[5], g.layer_slot[11], g.layer_slot[17]), ((0, 0), (0, 1), (0, 2)));
        assert_eq!((g.layer_slot[0], g.layer_slot[4], g.layer_slot[6]), ((1, 0), (2, 1), (2, 2)));
        // Every (group, index) is used by exactly one layer.
        let mut seen = g.layer_slot.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 18);
        assert!(g.releases());
    }

    #[test]
    fn a_sequence_may_outgrow_the_pool_by_what_its_local_groups_give_back() {
        let gemma = [None, Some(512), Some(512), Some(512), Some(512), Some(512)];
        // 6,000 pages of 16 tokens: every page kept, 1,000 blocks of 16 tokens; given back,
        // the five local groups hold (512 + 512) / 16 + 1 = 65 pages each and the global group
        // the other 5,675.
        assert_eq!(longest_sequence(&gemma, 6000, 16, 512), 5675 * 16);
        assert_eq!(longest_sequence(&[None], 6000, 16, 512), 6000 * 16);
        // Too small for the local share: every page kept.
        assert_eq!(longest_sequence(&gemma, 300, 16, 512), 50 * 16);
        assert_eq!(longest_sequence(&[Some(4096)], 300, 16, 512), usize::MAX);
        assert_eq!(longest_sequence(&[Some(4096)], 200, 16, 512), 200 * 16);
    }

    #[test]
    fn uneven_kinds_leave_the_last_group_partly_empty_and_one_kind_is_one_group() {
        // Gemma 3 1B: 26 layers, 4 global; local layers fill 6 groups of 4, the last holds 2.
        let w: Vec<Option<usize>> =
            (0..26).map(|l| if (l + 1) % 6 == 0 { None } else { Some(512) }).collect();
        let g = KvGroups::for_layers(&w);
        assert_eq!((g.layers_per_page, g.num_groups()), (4, 7));
        assert_eq!(g.layer_slot[25], (6, 1));
        // Every layer local (Mistral): one group that releases.
        let g = KvGroups::for_layers(&[Some(4096); 8]);
        assert_eq!((g.num_groups(), g.layers_per_page, g.windows[0]), (1, 8, Some(4096)));
        assert!(g.releases());
        let g = KvGroups::for_layers(&[None; 30]);
        assert_eq!(g, KvGroups::single(30));
        assert!(!g.releases());
    }
}
