/** A manifest file's objects shown through the API, and those it cannot show named to the caller with why. */
import { describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { showManifestObjects, type FileObject } from '../../src/api/manifest-objects.js';
import { Store } from '../../src/api/store.js';
import { silentLogger } from '../../src/log.js';

describe('showManifestObjects', () => {
  it('mirrors a file object, and tells notShown about one whose name an object written through the API holds', async () => {
    const store = new Store({ kinds: nodeKinds('n') });
    await localClient(store).create('configmaps', 'default', { metadata: { name: 'taken' } });
    const cm = (name: string): FileObject => ({ apiVersion: 'v1', kind: 'ConfigMap', namespace: 'default', name, uid: `u-${name}`, object: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name } }, source: { file: '/m/a.yaml' } });
    const files = [cm('fine'), cm('taken')];
    const told: string[] = [];
    const stop = showManifestObjects(store, { list: () => files, subscribe: () => () => undefined }, silentLogger, (o, why) => told.push(`${o.name}: ${why}`));
    expect((await localClient(store).get('configmaps', 'default', 'fine')).metadata.name).toBe('fine');
    expect(told[0]).toBe('taken: an object written through the API has its name, and keeps it');
    expect(told).toHaveLength(1);
    stop();
    store.close();
  });
});
