"""The timeline's script (``figure.tl``, drawn by ``html_timeline``): zoom and pan, one view for all
lanes, and the figures under the pointer.

Zoom and pan narrow the ``viewBox`` of every lane's plots (``svg.zp``) at once, so all lanes keep
one clock; the time axis (ticks and grid lines, ``g.xt``) and the step numbers (``g.sl``, per lane)
are redrawn in the outer, unscaled frame. Hover: a line through all lanes at the pointer's time and
a box with that time and, for the lane under the pointer, its column's figures (from the lane's
``data-v``: per bin, the ns of each of ``data-keys`` in order, empty for 0; the rest of the bin is
gaps under the threshold). Text goes in as ``textContent``: never markup. ``#tl0=a,b`` in the
address opens the timeline zoomed to that fraction of its span.
"""
from __future__ import annotations

ZOOM_JS = r"""
(function(){
function fmt(ns){var a=Math.abs(ns);if(a>=1e9)return (ns/1e9).toPrecision(3)+' s';
if(a>=1e6)return (ns/1e6).toPrecision(3)+' ms';if(a>=1e3)return (ns/1e3).toPrecision(3)+' us';
return Math.round(ns)+' ns';}
function ticks(lo,hi,n){var raw=(hi-lo)/n,mag=Math.pow(10,Math.floor(Math.log10(raw))),s=mag;
[1,2,5,10].some(function(m){s=m*mag;return s>=raw;});var out=[];
for(var v=Math.ceil(lo/s)*s;v<=hi+1e-9*s;v+=s)out.push(v);return out;}
var NS='http://www.w3.org/2000/svg';
function el(n,a){var e=document.createElementNS(NS,n);for(var k in a)e.setAttribute(k,a[k]);return e;}
function figures(l,t){var bin=+l.dataset.bin,i=Math.floor((t-l.dataset.start)/bin);
if(!l._v){l._v=l.dataset.v?l.dataset.v.split(' '):[];l._k=JSON.parse(l.dataset.keys);}
if(i<0||i>=l._v.length)return "outside the device's active window";
var s=+l.dataset.start+i*bin,used=0,parts=[];
l._v[i].split(',').forEach(function(v,j){if(v){used+=+v;parts.push(l._k[j]+' '+fmt(+v));}});
if(bin>used)parts.push('gaps under the threshold '+fmt(bin-used));
return fmt(s)+'–'+fmt(s+bin)+': '+parts.join(', ');}
document.querySelectorAll('figure.tl').forEach(function(f){
var pw=+f.dataset.pw,span=+f.dataset.span,v0=0,v1=pw;
var plots=f.querySelectorAll('svg.zp'),lanes=f.querySelectorAll('svg.lane'),xt=f.querySelector('g.xt'),
groups=f.querySelectorAll('g.sl'),cur=f.querySelector('line.cur'),tip=f.querySelector('div.tip');
var y=+xt.dataset.y,y0=+xt.dataset.y0;
function draw(){plots.forEach(function(p){p.setAttribute('viewBox',v0+' 0 '+(v1-v0)+' '+p.getAttribute('height'));});
var k=pw/(v1-v0),t0=v0/pw*span,t1=v1/pw*span;xt.textContent='';
ticks(t0,t1,8).forEach(function(t){var x=(t/span*pw-v0)*k;
xt.appendChild(el('line',{x1:x,x2:x,y1:y0,y2:y,'class':'vg'}));
xt.appendChild(el('line',{x1:x,x2:x,y1:y,y2:y+4,stroke:'#555'}));
var s=el('text',{x:x,y:y+15,'class':'ax','text-anchor':'middle'});s.textContent=fmt(t);xt.appendChild(s);});
groups.forEach(function(g){var last=-1e9;g.querySelectorAll('text.sn').forEach(function(s){
var x=(+s.dataset.x-v0)*k;s.setAttribute('x',x);var show=x>=0&&x<=pw&&x-last>=22;if(show)last=x;
s.setAttribute('visibility',show?'visible':'hidden');});});}
function frac(e){var r=lanes[0].getBoundingClientRect();return (e.clientX-r.left)/r.width;}
function zoom(c,fx){var w=(v1-v0)*fx;w=Math.max(Math.min(w,pw),pw/1e7);var a=c-(c-v0)*w/(v1-v0);
v0=Math.max(0,Math.min(a,pw-w));v1=v0+w;draw();}
function hide(){cur.setAttribute('visibility','hidden');tip.hidden=true;}
function hover(e){var fx=frac(e);if(!lanes.length||fx<0||fx>1){hide();return;}
var t=(v0+fx*(v1-v0))/pw*span,lines=['at '+fmt(t)+' on the shared clock'];
cur.setAttribute('x1',fx*pw);cur.setAttribute('x2',fx*pw);cur.setAttribute('visibility','visible');
lanes.forEach(function(l){var b=l.getBoundingClientRect();
if(e.clientY>=b.top&&e.clientY<=b.bottom)lines.push(l.dataset.name+': '+figures(l,t));});
tip.textContent=lines.join('\n');tip.hidden=false;var r=f.getBoundingClientRect(),x=e.clientX-r.left+14;
tip.style.left=(x+tip.offsetWidth>r.width?Math.max(0,x-28-tip.offsetWidth):x)+'px';
tip.style.top=(e.clientY-r.top+16)+'px';}
f.addEventListener('wheel',function(e){e.preventDefault();zoom(v0+frac(e)*(v1-v0),e.deltaY<0?0.8:1.25);},
{passive:false});
var drag=null;f.addEventListener('mousedown',function(e){drag=[e.clientX,v0,v1];});
window.addEventListener('mouseup',function(){drag=null;});
f.addEventListener('mousemove',function(e){hover(e);if(!drag)return;var r=lanes[0].getBoundingClientRect();
var d=(e.clientX-drag[0])/r.width*(drag[2]-drag[1]);var w=drag[2]-drag[1];
v0=Math.max(0,Math.min(drag[1]-d,pw-w));v1=v0+w;draw();});
f.addEventListener('mouseleave',hide);
f.addEventListener('dblclick',function(){v0=0;v1=pw;draw();});
var m=location.hash.match(new RegExp('[#&]'+f.id+'=([0-9.]+),([0-9.]+)'));
if(m){v0=Math.max(0,+m[1]*pw);v1=Math.min(pw,Math.max(+m[2]*pw,v0+pw/1e7));draw();}
f.querySelectorAll('button').forEach(function(b){b.addEventListener('click',function(){
var z=b.dataset.z;if(z==='reset'){v0=0;v1=pw;draw();}else zoom((v0+v1)/2,z==='in'?0.5:2);});});
});})();
"""
