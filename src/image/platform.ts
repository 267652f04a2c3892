/** Platform matching for manifest lists and OCI indexes. */
export interface Platform {
  os: string;
  architecture: string;
  variant?: string;
}

export function hostPlatform(arch: string = process.arch): Platform {
  switch (arch) {
    case 'x64':
      return { os: 'linux', architecture: 'amd64' };
    case 'arm64':
      return { os: 'linux', architecture: 'arm64', variant: 'v8' };
    case 'arm':
      return { os: 'linux', architecture: 'arm', variant: 'v7' };
    case 'ia32':
      return { os: 'linux', architecture: '386' };
    default:
      return { os: 'linux', architecture: arch };
  }
}

export function formatPlatform(p: Platform): string {
  return [p.os, p.architecture, p.variant].filter(Boolean).join('/');
}

/**
 * Picks the best entry for `want`: same os and architecture, then an exact
 * variant over a missing one (arm64 without a variant means v8).
 */
export function selectPlatform<T extends { platform?: Partial<Platform> }>(entries: T[], want: Platform): T | undefined {
  let best: T | undefined;
  let bestScore = -1;
  for (const e of entries) {
    const p = e.platform;
    if (!p || p.os !== want.os || p.architecture !== want.architecture) continue;
    let score: number;
    if (!want.variant) score = p.variant ? 0 : 1;
    else if (p.variant === want.variant) score = 2;
    else if (!p.variant) score = 1;
    else continue;
    if (score > bestScore) {
      best = e;
      bestScore = score;
    }
  }
  return best;
}
