//! The distinct prompts of a batch: one algorithm per slot.

/// Algorithms named in the prompts; slot `i` uses entry `i % len`.
pub const ALGORITHMS: [&str; 40] = [
    "binary search",
    "quicksort",
    "merge sort",
    "heap sort",
    "insertion sort",
    "Dijkstra's shortest path",
    "breadth-first search",
    "depth-first search",
    "topological sort",
    "Kruskal's minimum spanning tree",
    "Prim's minimum spanning tree",
    "union-find with path compression",
    "the Knuth-Morris-Pratt string search",
    "the Rabin-Karp string search",
    "longest common subsequence",
    "edit distance",
    "0/1 knapsack",
    "the Bellman-Ford algorithm",
    "the Floyd-Warshall algorithm",
    "A* search on a grid",
    "an LRU cache",
    "a trie with insert and prefix search",
    "a binary heap priority queue",
    "reservoir sampling",
    "the Fisher-Yates shuffle",
    "the sieve of Eratosthenes",
    "fast modular exponentiation",
    "the extended Euclidean algorithm",
    "matrix multiplication",
    "counting sort",
    "radix sort",
    "Kadane's maximum subarray",
    "the longest increasing subsequence",
    "Tarjan's strongly connected components",
    "a segment tree with range sums",
    "a Fenwick tree",
    "bucket sort",
    "the convex hull (Graham scan)",
    "run-length encoding",
    "Huffman coding",
];

/// The prompt of `slot`; slots past the list get a numbered variant so every slot stays distinct.
pub fn prompt_for(slot: usize) -> String {
    let name = ALGORITHMS[slot % ALGORITHMS.len()];
    let round = slot / ALGORITHMS.len();
    if round == 0 {
        format!("Write a Python function implementing {name}. Code only.")
    } else {
        format!("Write a Python function implementing {name} (variant {round}). Code only.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_hundred_slots_are_distinct() {
        let set: std::collections::HashSet<String> = (0..100).map(prompt_for).collect();
        assert_eq!(set.len(), 100);
        assert_eq!(
            prompt_for(1),
            "Write a Python function implementing quicksort. Code only."
        );
    }
}
