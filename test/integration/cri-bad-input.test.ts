/**
 * Bad input at the CRI door, sent by a real gRPC client on the real socket:
 * messages over the size limit, bytes that are not protobuf, ids that are not
 * what they claim (a pod's id as a container's, a prefix of two ids, paths
 * and NULs), unsafe names, and duplicate calls racing each other. Each gets a
 * clear status, and the daemon keeps serving.
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';

describe.skipIf(!isRoot)('bad input at the CRI door', () => {
  let fx: PodFixture;
  let seq = 0;

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/badinput-busybox');
  });

  afterAll(async () => {
    const leaks = await fx?.cleanup();
    expect(leaks?.mounts ?? [], 'mounts left behind').toEqual([]);
    expect(leaks?.processes ?? [], 'processes left behind').toEqual([]);
  });

  function podConfig(name = `bad${++seq}`) {
    return {
      metadata: { name, namespace: 'test', uid: `uid-${name}`, attempt: 0 },
      hostname: name,
      logDirectory: path.join(fx.dirs.base, 'logs', name),
      linux: {},
    };
  }

  async function runPod() {
    const config = podConfig();
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    return { id: podSandboxId!, config };
  }

  function containerConfig(name: string, extra: Record<string, unknown> = {}) {
    return { metadata: { name }, image: { image: fx.image }, command: ['sleep', '1000'], linux: {}, ...extra };
  }

  /** The daemon still answers, and a whole pod cycle still works. */
  async function stillServing(): Promise<void> {
    expect((await fx.skiff.runtime.Version({})).runtimeName).toBe('skiff');
    const pod = await runPod();
    const { containerId } = await fx.skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: containerConfig('alive'), sandboxConfig: pod.config });
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  }

  /** A raw unary call: `body` goes on the wire as the request message, unchecked. */
  function rawCall(method: string, body: Buffer): Promise<{ code: grpc.status; details: string }> {
    const client = new grpc.Client(`unix:${fx.dirs.socket}`, grpc.credentials.createInsecure());
    return new Promise((resolve, reject) => {
      client.makeUnaryRequest(
        method,
        (b: Buffer) => b,
        (b: Buffer) => b,
        body,
        new grpc.Metadata(),
        { deadline: Date.now() + 30_000 },
        (err, _res) => {
          client.close();
          if (err) resolve({ code: err.code, details: err.details });
          else reject(new Error(`${method} accepted ${body.length} bytes of garbage`));
        },
      );
    });
  }

  it('a message over the 16 MiB receive limit is RESOURCE_EXHAUSTED, and the daemon keeps serving', async () => {
    const err = await codeOf(fx.skiff.images.PullImage({ image: { image: 'x'.repeat(17 << 20) } }));
    expect(err.code, err.details).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(err.details).toMatch(/larger than max|message/i);
    const err2 = await codeOf(fx.skiff.runtime.RunPodSandbox({ config: { ...podConfig(), annotations: { big: 'y'.repeat(17 << 20) } } }));
    expect(err2.code, err2.details).toBe(grpc.status.RESOURCE_EXHAUSTED);
    await stillServing();
  });

  it('bytes that are not a protobuf message get a clear status, and the daemon keeps serving', async () => {
    // Field 1, length-delimited, claiming 2^31 bytes that never come.
    const truncated = Buffer.from([0x0a, 0xff, 0xff, 0xff, 0xff, 0x07, 0x01]);
    // Field 1 as a varint cut off mid-way.
    const cutVarint = Buffer.from([0x08, 0xff, 0xff]);
    for (const [method, body] of [
      ['/runtime.v1.RuntimeService/RunPodSandbox', truncated],
      ['/runtime.v1.RuntimeService/CreateContainer', cutVarint],
      ['/runtime.v1.ImageService/PullImage', truncated],
      ['/runtime.v1.RuntimeService/RemovePodSandbox', cutVarint],
    ] as const) {
      const r = await rawCall(method, body);
      expect([grpc.status.INVALID_ARGUMENT, grpc.status.INTERNAL], `${method}: ${r.details}`).toContain(r.code);
      expect(r.details, method).toMatch(/deserializ|pars|invalid|wire/i);
    }
    // A field with wire type 7, which does not exist: the decoder is lenient, and what it
    // makes of the bytes (pod_sandbox_id "\u0002") is then refused as no id.
    const badWireType = Buffer.from([0x0f, 0x01, 0x02]);
    const w = await rawCall('/runtime.v1.RuntimeService/CreateContainer', badWireType);
    expect(w.code, w.details).toBe(grpc.status.INVALID_ARGUMENT);
    // A method that does not exist.
    const r = await rawCall('/runtime.v1.RuntimeService/NoSuchMethod', Buffer.alloc(0));
    expect(r.code).toBe(grpc.status.UNIMPLEMENTED);
    await stillServing();
  });

  it("a pod sandbox's id given as a container's, or the reverse, is INVALID_ARGUMENT and touches nothing", async () => {
    const pod = await runPod();
    const { containerId } = await fx.skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: containerConfig('kind'), sandboxConfig: pod.config });
    const cid = containerId!;
    for (const call of [
      () => fx.skiff.runtime.ContainerStatus({ containerId: pod.id }),
      () => fx.skiff.runtime.StartContainer({ containerId: pod.id }),
      () => fx.skiff.runtime.StopContainer({ containerId: pod.id, timeout: 0 }),
      () => fx.skiff.runtime.RemoveContainer({ containerId: pod.id }),
      () => fx.skiff.runtime.ExecSync({ containerId: pod.id, cmd: ['true'], timeout: 5 }),
    ]) {
      const err = await codeOf(call());
      expect(err.code, err.details).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(/is the id of a pod sandbox, not of a container/);
    }
    for (const call of [
      () => fx.skiff.runtime.PodSandboxStatus({ podSandboxId: cid }),
      () => fx.skiff.runtime.StopPodSandbox({ podSandboxId: cid }),
      () => fx.skiff.runtime.RemovePodSandbox({ podSandboxId: cid }),
    ]) {
      const err = await codeOf(call());
      expect(err.code, err.details).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(/is the id of a container, not of a pod sandbox/);
    }
    expect((await fx.skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id })).status?.state).toBe('SANDBOX_READY');
    expect((await fx.skiff.runtime.ContainerStatus({ containerId: cid })).status?.state).toBe('CONTAINER_CREATED');
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  });

  it('a prefix that matches two ids is INVALID_ARGUMENT naming the ambiguity, and removes nothing', async () => {
    const pod = await runPod();
    // Containers until two ids share their first character (at most 17 by pigeonhole).
    const byFirst = new Map<string, string[]>();
    let prefix = '';
    for (let i = 0; !prefix; i++) {
      const { containerId } = await fx.skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: containerConfig(`amb${i}`), sandboxConfig: pod.config });
      const list = byFirst.get(containerId![0]!) ?? [];
      list.push(containerId!);
      byFirst.set(containerId![0]!, list);
      if (list.length === 2) prefix = containerId![0]!;
    }
    for (const call of [
      () => fx.skiff.runtime.ContainerStatus({ containerId: prefix }),
      () => fx.skiff.runtime.StopContainer({ containerId: prefix, timeout: 0 }),
      () => fx.skiff.runtime.RemoveContainer({ containerId: prefix }),
    ]) {
      const err = await codeOf(call());
      expect(err.code, err.details).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(/ambiguous: it matches 2 containers/);
    }
    const { containers } = await fx.skiff.runtime.ListContainers({ filter: { podSandboxId: pod.id } });
    expect((containers ?? []).map((c) => c.id)).toEqual(expect.arrayContaining(byFirst.get(prefix)!));
    // A unique prefix still works.
    const one = byFirst.get(prefix)![0]!;
    expect((await fx.skiff.runtime.ContainerStatus({ containerId: one.slice(0, 20) })).status?.id).toBe(one);

    // Pods the same way.
    const pods = new Map<string, string[]>([[pod.id[0]!, [pod.id]]]);
    let podPrefix = '';
    while (!podPrefix) {
      const p = await runPod();
      const list = pods.get(p.id[0]!) ?? [];
      list.push(p.id);
      pods.set(p.id[0]!, list);
      if (list.length === 2) podPrefix = p.id[0]!;
    }
    for (const call of [() => fx.skiff.runtime.PodSandboxStatus({ podSandboxId: podPrefix }), () => fx.skiff.runtime.RemovePodSandbox({ podSandboxId: podPrefix })]) {
      const err = await codeOf(call());
      expect(err.code, err.details).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(/ambiguous: it matches 2 pod sandboxes/);
    }
    const left = ((await fx.skiff.runtime.ListPodSandbox({})).items ?? []).map((p) => p.id);
    expect(left).toEqual(expect.arrayContaining(pods.get(podPrefix)!));
    for (const id of left) await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: id! });
  });

  it("ids and names with '/', '..' or NUL, and log paths out of the log directory, are INVALID_ARGUMENT", async () => {
    for (const id of ['../../etc', 'a/b', 'ab\0cd', 'x'.repeat(65)]) {
      for (const call of [
        () => fx.skiff.runtime.ContainerStatus({ containerId: id }),
        () => fx.skiff.runtime.RemoveContainer({ containerId: id }),
        () => fx.skiff.runtime.StopPodSandbox({ podSandboxId: id }),
        () => fx.skiff.runtime.RemovePodSandbox({ podSandboxId: id }),
      ]) {
        const err = await codeOf(call());
        expect(err.code, `${JSON.stringify(id)}: ${err.details}`).toBe(grpc.status.INVALID_ARGUMENT);
        expect(err.details).toMatch(/is not an id/);
      }
    }
    // The last ones would reach CNI_ARGS as arguments of their own: host-local takes IP= as the pod's address.
    for (const md of [{ name: 'a/b' }, { name: '..' }, { name: 'x\0y' }, { namespace: '../etc' }, { uid: 'u/../v' }, { name: 'inj;IP=10.88.0.250' }, { namespace: 'ns;IP=10.88.0.251' }, { uid: 'u;K8S_POD_NAME=other' }, { name: 'a=b' }]) {
      const config = podConfig();
      const err = await codeOf(fx.skiff.runtime.RunPodSandbox({ config: { ...config, metadata: { ...config.metadata, ...md } } }));
      expect(err.code, `${JSON.stringify(md)}: ${err.details}`).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(/is not allowed/);
    }
    const pod = await runPod();
    for (const [name, extra] of [
      ['c/d', {}],
      ['..', {}],
      ['nul\0', {}],
      ['logs', { logPath: '../../../etc/evil.log' }],
      ['logs', { logPath: '/etc/evil.log' }],
      ['wd', { workingDir: '/srv\0/x' }],
    ] as const) {
      const err = await codeOf(fx.skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: containerConfig(name, extra), sandboxConfig: pod.config }));
      expect(err.code, `${JSON.stringify(name)}: ${err.details}`).toBe(grpc.status.INVALID_ARGUMENT);
    }
    expect((await fx.skiff.runtime.ListContainers({})).containers ?? []).toEqual([]);
    // Unknown but well-formed ids keep their old answers: NotFound, and success for removals.
    expect((await codeOf(fx.skiff.runtime.ContainerStatus({ containerId: 'ffffffffffff' }))).code).toBe(grpc.status.NOT_FOUND);
    await fx.skiff.runtime.RemoveContainer({ containerId: 'ffffffffffff' });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    await stillServing();
  });

  it('a hostname or port mapping the kernel or CNI cannot take is INVALID_ARGUMENT before anything is made', async () => {
    const before = (await fx.skiff.runtime.ListPodSandbox({})).items!.length;
    const bad: Array<[Record<string, unknown>, RegExp]> = [
      [{ hostname: 'h'.repeat(65) }, /hostname .* is not a host name/],
      [{ hostname: 'a/b' }, /hostname .* is not a host name/],
      [{ hostname: 'two words' }, /hostname .* is not a host name/],
      [{ portMappings: [{ protocol: 'TCP', containerPort: 80, hostPort: 70000 }] }, /host_port 70000 is not a port/],
      [{ portMappings: [{ protocol: 'TCP', containerPort: -1, hostPort: 0 }] }, /container_port -1 is not a port/],
      [{ portMappings: [{ protocol: 'TCP', containerPort: 0, hostPort: 8080 }] }, /maps host port 8080 to no container port/],
      [{ portMappings: [{ protocol: 'TCP', containerPort: 80, hostPort: 8080, hostIp: 'not-an-ip' }] }, /host_ip .* is not an IP address/],
    ];
    for (const [extra, message] of bad) {
      const err = await codeOf(fx.skiff.runtime.RunPodSandbox({ config: { ...podConfig(), ...extra } }));
      expect(err.code, JSON.stringify(extra)).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(message);
    }
    expect((await fx.skiff.runtime.ListPodSandbox({})).items!.length).toBe(before);
    await stillServing();
  });

  it('the same RunPodSandbox twice at once: exactly one succeeds, the other is ALREADY_EXISTS', async () => {
    for (let round = 0; round < 5; round++) {
      const config = podConfig();
      const results = await Promise.allSettled([fx.skiff.runtime.RunPodSandbox({ config }), fx.skiff.runtime.RunPodSandbox({ config })]);
      const ok = results.filter((r) => r.status === 'fulfilled');
      const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
      expect(ok, `round ${round}`).toHaveLength(1);
      expect((failed[0]!.reason as grpc.ServiceError).code, (failed[0]!.reason as grpc.ServiceError).details).toBe(grpc.status.ALREADY_EXISTS);
      const mine = ((await fx.skiff.runtime.ListPodSandbox({})).items ?? []).filter((p) => p.metadata?.name === config.metadata.name);
      expect(mine).toHaveLength(1);
      // Once it is there, the same call again is ALREADY_EXISTS too.
      expect((await codeOf(fx.skiff.runtime.RunPodSandbox({ config }))).code).toBe(grpc.status.ALREADY_EXISTS);
      // The same container name twice at once, likewise.
      const podId = mine[0]!.id!;
      const cs = await Promise.allSettled([0, 1].map(() => fx.skiff.runtime.CreateContainer({ podSandboxId: podId, config: containerConfig('twice'), sandboxConfig: config })));
      expect(cs.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
      const cerr = cs.find((r): r is PromiseRejectedResult => r.status === 'rejected')!.reason as grpc.ServiceError;
      expect(cerr.code, cerr.details).toBe(grpc.status.ALREADY_EXISTS);
      await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: podId });
    }
    await stillServing();
  });
});
