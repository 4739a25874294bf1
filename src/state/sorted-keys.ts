/**
 * The keys of one kind of document, kept sorted, so a list by prefix costs the keys it
 * returns (plus a binary search), not a scan and sort of every key of the kind: the control
 * plane lists one volume's replicas by prefix once per volume, and a scan would make a pass
 * over N volumes O(N²).
 *
 * @packageDocumentation
 */

/** Code-unit order, the order `StateStore.list` returns keys in. */
function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** See the module comment. */
export class SortedKeys {
  readonly #keys: string[] = [];

  /** Builds one from keys in any order (duplicates once). */
  static of(keys: Iterable<string>): SortedKeys {
    const s = new SortedKeys();
    s.#keys.push(...new Set(keys));
    s.#keys.sort(compare);
    return s;
  }

  get size(): number {
    return this.#keys.length;
  }

  // The first index whose key is >= `key`.
  #lowerBound(key: string): number {
    let lo = 0;
    let hi = this.#keys.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.#keys[mid]! < key) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  has(key: string): boolean {
    return this.#keys[this.#lowerBound(key)] === key;
  }

  add(key: string): void {
    const i = this.#lowerBound(key);
    if (this.#keys[i] !== key) this.#keys.splice(i, 0, key);
  }

  delete(key: string): void {
    const i = this.#lowerBound(key);
    if (this.#keys[i] === key) this.#keys.splice(i, 1);
  }

  /** The keys starting with `prefix` ('' = all), in order (a copy). */
  withPrefix(prefix: string): string[] {
    if (prefix === '') return [...this.#keys];
    const out: string[] = [];
    for (let i = this.#lowerBound(prefix); i < this.#keys.length && this.#keys[i]!.startsWith(prefix); i++) out.push(this.#keys[i]!);
    return out;
  }
}
