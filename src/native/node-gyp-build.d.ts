// node-gyp-build ships no types.
declare module 'node-gyp-build' {
  interface NodeGypBuild {
    (dir: string): unknown;
    /** Path of the addon that `load(dir)` would require; throws when none matches. */
    resolve(dir: string): string;
    path(dir: string): string;
  }
  const load: NodeGypBuild;
  export default load;
}
