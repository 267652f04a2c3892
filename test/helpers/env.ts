export const isRoot = process.getuid?.() === 0;
export const rootSkipReason = 'needs root: layers are unpacked with owners, device nodes and trusted.* xattrs';
