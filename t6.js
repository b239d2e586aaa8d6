tr("all", () => d.getCollection('we"ird').find({}, {_id: 0}).toArray());
tr("capped", () => d.createCollection('ca"p', {capped: true, size: 4096}));
tr("list", () => d.getCollectionInfos().map(c => [c.name, c.options]));
